"""Exactly-once micro-batches into Parquet vs Spark's own read + write, at three batch sizes, with fitted costs.

Both sides read the same offset range of the same topic with the same warm local SparkSession
and write Parquet; ours adds planning (ledger + Kafka offsets), staging and the atomic publish.
For each size (10k, 100k, 1M records by default) it runs --repeat rounds, prints each, and
fits seconds = fixed + records x per-record cost to the medians of both sides, so the
protocol's own cost (plan + notify_complete, and what the write adds) shows apart from
Spark's. Prints the load average too: the machine is shared.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_parquet_batch.py [--sizes 10000 100000 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.planning import plan_batch
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import create_committer
from airflow_exactly_once.spark.batch_read import kafka_read_options
from airflow_exactly_once.spark.in_process_session import build_spark_session, stop_spark
from airflow_exactly_once.spark.write_job import run_write
from devtools.kafka_broker import LocalKafkaBroker
from devtools.maven import use_prefetched_connector

PARTITIONS = 3


def produce(bootstrap: str, topic: str, records: int, size: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=512 * 1024)
    payload = os.urandom(size // 2).hex().encode()[:size]
    for i in range(records):
        producer.send(topic, value=payload, partition=i % PARTITIONS)
    producer.flush()
    producer.close()


def exactly_once_batch(spark, work: Path, bootstrap: str, topic: str, n: int) -> dict[str, float]:
    config = checked(PipelineConfig(pipeline_id=f"bench-{n}", topics=[topic], bootstrap_servers=bootstrap,
                            sink={"type": "parquet", "path": str(work / f"eo-{n}")}))
    ledger = Ledger(f"sqlite:///{work / 'ledger.db'}")
    coordinator = BatchCoordinator(config, ledger, create_committer(config.sink))
    t0 = time.perf_counter()
    batch = plan_batch(coordinator, lambda: KafkaOffsetSource(KafkaSettings.of(config)), f"run-{n}").batch
    t1 = time.perf_counter()
    summary = run_write(spark, coordinator, batch.id)
    t2 = time.perf_counter()
    coordinator.commit(batch.id)
    t3 = time.perf_counter()
    assert summary["output_records"] > 0
    return {"plan": t1 - t0, "write": t2 - t1, "notify_complete": t3 - t2, "total": t3 - t0,
            "records": summary["output_records"], "_batch": batch, "_config": config}


def spark_baseline(spark, work: Path, batch, config, n: int) -> float:
    """Spark's own Kafka batch read of the same range, written straight to Parquet."""
    options = kafka_read_options(batch, config)
    options.pop("kafka.isolation.level")  # the plain default read
    # a group of Spark's own: ours reads the pooled reader group with other settings, which Spark's
    # consumer cache refuses for the same group ("Kafka parameters for same cache key should be equal")
    options.pop("kafka.group.id")
    t0 = time.perf_counter()
    spark.read.format("kafka").options(**options).load().write.mode("overwrite").parquet(str(work / f"plain-{n}"))
    return time.perf_counter() - t0


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares seconds = fixed + records x per_record over (records, seconds) points."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return mean_y - slope * mean_x, slope


def main() -> None:
    use_prefetched_connector()  # the Kafka connector jars fetched by `make setup`
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--size", type=int, default=100, help="bytes per record value")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="aeo-bench-"))
    broker = LocalKafkaBroker(work / "kafka").start()
    spark = build_spark_session("bench", {"spark.master": "local[*]"})
    spark.sparkContext.setLogLevel("ERROR")
    medians: dict[int, dict[str, float]] = {}
    try:
        for records in args.sizes:
            topic = f"bench-{records}"
            produce(broker.bootstrap_servers, topic, records, args.size)
            # Warm-up of both paths (JIT, connector class loading), not measured.
            warm = exactly_once_batch(spark, work, broker.bootstrap_servers, topic, records * 10)
            spark_baseline(spark, work, warm["_batch"], warm["_config"], records * 10)
            ours, plain = [], []
            for n in range(1, args.repeat + 1):
                result = exactly_once_batch(spark, work, broker.bootstrap_servers, topic, records * 10 + n)
                baseline = spark_baseline(spark, work, result["_batch"], result["_config"], records * 10 + n)
                ours.append(result)
                plain.append(baseline)
                print(f"{records:>9,} records, round {n}: exactly-once plan={result['plan']:.3f}s "
                      f"write={result['write']:.3f}s notify_complete={result['notify_complete']:.3f}s "
                      f"total={result['total']:.3f}s | spark read+write={baseline:.3f}s", flush=True)
            medians[records] = {k: statistics.median(r[k] for r in ours)
                                for k in ("plan", "write", "notify_complete", "total")}
            medians[records]["spark"] = statistics.median(plain)
    finally:
        stop_spark(spark)
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()

    print(f"\nmedians of {args.repeat} rounds (seconds), {args.size}-byte records, {PARTITIONS} partitions, local[*]; "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after:")
    print(f"{'records':>10} {'plan':>7} {'write':>7} {'notify':>7} {'ours':>7} {'spark':>7} {'ratio':>6}")
    for records, m in medians.items():
        print(f"{records:>10,} {m['plan']:>7.3f} {m['write']:>7.3f} {m['notify_complete']:>7.3f} {m['total']:>7.3f} "
              f"{m['spark']:>7.3f} {m['total'] / m['spark']:>5.2f}x")
    for label, key in (("exactly-once (plan + write + notify_complete)", "total"), ("Spark read + write", "spark")):
        if len(medians) < 2:  # one size: nothing to fit
            break
        fixed, per_record = fit([(r, m[key]) for r, m in medians.items()])
        print(f"{label:<46} fixed {fixed:6.3f} s, {per_record * 1e6:6.3f} s per million records")
    protocol = [m["plan"] + m["notify_complete"] for m in medians.values()]
    print(f"protocol steps (plan + notify_complete): {min(protocol):.3f} to {max(protocol):.3f} s per batch")


if __name__ == "__main__":
    main()
