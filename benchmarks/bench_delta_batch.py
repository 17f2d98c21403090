"""The Delta Lake sink against Spark's own Delta append, and notify_complete as the table grows.

Three measurements, one run:

1. A batch of `--records` records (1,000,000 by default, ~100 B values): ours (Spark's Parquet writer stages
   it in the table's folder, then delta-rs adds the files in one commit) vs Spark's own
   `df.write.format("delta").mode("append")` of the same DataFrame into a table of its own. Both sides get
   the same warm local SparkSession (with Delta's extension and catalog, which only Spark's side uses);
   the Kafka read, the same for both, is left out (bench_iceberg_batch.py measures a whole batch from
   Kafka). Rounds alternate which side goes first; ratio = ours / Spark's (the bar: <= 1.2).
2. notify_complete of a batch of 12 files (a fresh committer, as a new task process has): the bar is 0.5 s.
3. The same after `--batches` batches (1,000 by default) in one table: the commit's time every 100
   batches, the curve that delta-rs's checkpoints (every 100 commits) should keep flat.

    PYTHONPATH=. python benchmarks/bench_delta_batch.py [--records 1000000] [--rounds 3] [--batches 1000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.sinks import create_committer, create_writer
from airflow_exactly_once.sinks.delta.runtime import CATALOG, EXTENSION
from devtools.maven import delta_jars

PIPELINE = "bench-delta"
FILES = 12


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master("local[2]").appName("bench-delta").config("spark.jars", ",".join(delta_jars()))
            .config("spark.sql.extensions", EXTENSION).config("spark.sql.catalog.spark_catalog", CATALOG)
            .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.memory", "2g").getOrCreate())


def records(spark: Any, n: int, files: int = FILES) -> Any:
    """`n` records over `files` Spark partitions: a key, a ~100-byte value and a number."""
    return spark.range(n, numPartitions=files).selectExpr(
        "CAST(id AS STRING) AS key", "concat('value-', CAST(id AS STRING), repeat('x', 88)) AS value", "id AS n")


def batch(seq: int) -> Batch:
    return Batch(PIPELINE, seq, f"run-{seq}", BatchState.PREPARED, 1, ())


def ours(spark: Any, root: Path, frame: Any, seq: int) -> tuple[float, float]:
    """(stage seconds, notify_complete seconds) of one batch."""
    spec = {"type": "delta", "path": str(root), "create_table": True}
    t0 = time.perf_counter()
    staged = create_writer(spec).stage(frame, batch(seq), lambda *_: [])
    t1 = time.perf_counter()
    create_committer(spec).commit(batch(seq), staged)  # a fresh committer, as notify_complete's process has
    return t1 - t0, time.perf_counter() - t1


def spark_append(root: Path, frame: Any) -> float:
    t0 = time.perf_counter()
    frame.write.format("delta").mode("append").save(str(root))
    return time.perf_counter() - t0


def compare(spark: Any, work: Path, n: int, rounds: int) -> None:
    frame = records(spark, n)
    ours_times, spark_times, commits = [], [], []
    for round_ in range(rounds):
        for side in (("ours", "spark") if round_ % 2 == 0 else ("spark", "ours")):
            if side == "ours":
                stage, commit = ours(spark, work / f"ours-{round_}", frame, round_ + 1)
                ours_times.append(stage + commit)
                commits.append(commit)
            else:
                spark_times.append(spark_append(work / f"spark-{round_}", frame))
        print(f"round {round_ + 1}: ours {ours_times[-1]:.2f} s (notify_complete {commits[-1] * 1000:.0f} ms), "
              f"Spark's Delta append {spark_times[-1]:.2f} s")
    mine, theirs = statistics.median(ours_times), statistics.median(spark_times)
    print(f"{n:,} records: ours {mine:.2f} s, Spark's Delta append {theirs:.2f} s: {mine / theirs:.2f}x the time "
          f"(bar: 1.2x); notify_complete of a {FILES}-file batch: median {statistics.median(commits) * 1000:.0f} ms "
          "(bar: 500 ms)")


def curve(spark: Any, work: Path, batches: int) -> None:
    """Many small 12-file batches into one table; the commit's time sampled every 100 (and the first)."""
    root = work / "curve"
    frame = records(spark, 1200).cache()
    frame.count()
    samples = []
    for seq in range(1, batches + 1):
        _, commit = ours(spark, root, frame, seq)
        samples.append(commit)
        if seq == 1 or seq % 100 == 0:
            window = samples[-100:]
            print(f"after {seq:5d} batches: notify_complete {commit * 1000:6.1f} ms "
                  f"(median of the last {len(window)}: {statistics.median(window) * 1000:.1f} ms)")
    print(f"{batches} batches: the slowest notify_complete {max(samples) * 1000:.0f} ms (bar: 500 ms)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=1000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-delta-"))
    spark = spark_session()
    try:
        compare(spark, work, args.records, args.rounds)
        curve(spark, work, args.batches)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
