"""The Parquet sink on object storage vs Spark's own `df.write.parquet("s3a://...")`, on the same S3-compatible
server (s3proxy, devtools/object_storage.py), and notify_complete of a 12-file batch.

Both sides write the same cached DataFrame (`--records`, 1,000,000 by default: a key, a 100-character value, a
number) with the same warm local SparkSession. Ours: the write (one open multipart upload per Spark partition)
then notify_complete (completing them, the manifest entry); Spark's: Hadoop's s3a file system with S3A's magic
committer (spark-hadoop-cloud), which writes without renames. hadoop-aws at pyspark's own Hadoop release and the
AWS SDK bundle it depends on come through `spark.jars.packages` (benchmark only: the package never needs them;
the first run downloads them). Prints each round, the medians, the ratio (goal: at most 1.2x) and the load
average; then notify_complete of a 12-file batch (goal: under 1 s). Run it alone: the machine is shared.

s3proxy runs its `filesystem` store here (devtools/object_storage.py): its `filesystem-nio2` store lists
folders as objects without a size, on which S3A (AWS SDK v2) fails with a NullPointerException.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_parquet_object_storage.py [--records 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import create_committer, create_writer
from airflow_exactly_once.spark.in_process_session import build_spark_session, stop_spark
from airflow_exactly_once.spark.packages import IVY_SETTINGS, spark_home
from airflow_exactly_once.spark.partition_writers import run_partition_writers
from devtools.maven import use_prefetched_connector
from devtools.object_storage import REGION, LocalObjectStorage

CONN_ID = "bench_lake"


def hadoop_version() -> str:
    """The Hadoop release pyspark bundles (hadoop-client-api-<version>.jar): hadoop-aws must match it."""
    for jar in (spark_home() / "jars").glob("hadoop-client-api-*.jar"):
        return re.sub(r"^hadoop-client-api-|\.jar$", "", jar.name)
    raise RuntimeError("pyspark bundles no hadoop-client-api jar: cannot tell which hadoop-aws to load")


def s3a_conf(server: LocalObjectStorage) -> dict[str, str]:
    from airflow_exactly_once.spark.packages import scala_version, spark_version

    # Hadoop's S3A "magic" committer through spark-hadoop-cloud: Spark's own way to write to S3 without renames
    # (the classic committer renames task folders, which S3 has not and s3proxy refuses).
    cloud = f"org.apache.spark:spark-hadoop-cloud_{scala_version()}:{spark_version()}"
    return {"spark.jars.packages": f"org.apache.hadoop:hadoop-aws:{hadoop_version()},{cloud}",
            # a pom-only module Ivy cannot fetch a jar of; hadoop-aws, named above, is what it would bring
            "spark.jars.excludes": "org.apache.hadoop:hadoop-cloud-storage",
            "spark.hadoop.fs.s3a.committer.name": "magic", "spark.hadoop.fs.s3a.committer.magic.enabled": "true",
            "spark.sql.sources.commitProtocolClass": "org.apache.spark.internal.io.cloud.PathOutputCommitProtocol",
            "spark.sql.parquet.output.committer.class":
                "org.apache.spark.internal.io.cloud.BindingParquetOutputCommitter",
            "spark.jars.ivySettings": str(IVY_SETTINGS),
            "spark.hadoop.fs.s3a.endpoint": server.endpoint_url, "spark.hadoop.fs.s3a.endpoint.region": REGION,
            "spark.hadoop.fs.s3a.path.style.access": "true", "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            "spark.hadoop.fs.s3a.access.key": server.access_key, "spark.hadoop.fs.s3a.secret.key": server.secret_key,
            "spark.hadoop.fs.s3a.aws.credentials.provider":
                "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"}


def spark_write(frame, url: str) -> float | None:
    """Seconds of Spark's own write of `frame` to `url`; None (and why, printed) when it fails."""
    t0 = time.perf_counter()
    try:
        frame.write.mode("overwrite").parquet(url)
    except Exception as exc:  # noqa: BLE001 - the baseline's failure is reported, ours still measured
        cause = next((line for line in str(exc).splitlines() if "Caused by" in line), str(exc).splitlines()[0])
        print(f"Spark's df.write.parquet({url}) failed: {cause[:300]}", flush=True)
        return None
    seconds = time.perf_counter() - t0
    print(f"  Spark's df.write.parquet(s3a://) {seconds:.2f} s", flush=True)
    return seconds


class Sink:
    """One pipeline writing to s3://<bucket>/<name>, its batches planted directly in a SQLite ledger."""

    def __init__(self, work: Path, bucket: str, name: str) -> None:
        spec = {"type": "parquet", "path": f"s3://{bucket}/{name}", "aws_conn_id": CONN_ID}
        self.config = checked(PipelineConfig(pipeline_id=name, topics=["in"], bootstrap_servers="127.0.0.1:9",
                                             sink=spec))
        self.ledger = Ledger(f"sqlite:///{work / f'{name}.db'}")
        self.coordinator = BatchCoordinator(self.config, self.ledger, create_committer(spec))
        self.writer = create_writer(spec).bind(self.config, self.coordinator.sink)
        self.coordinator.sink.check(name)
        self.ledger.ensure_pipeline(name, self.config.fingerprint(), self.config.to_stored_dict())
        self.next_offset = 0

    def batch(self, frame, records: int) -> dict[str, float]:
        epoch = self.ledger.pipeline(self.config.pipeline_id)["epoch"]
        planned = self.ledger.create_batch(self.config.pipeline_id, "bench", [
            OffsetRange("in", 0, self.next_offset, self.next_offset + records)], expected_epoch=epoch)
        self.next_offset += records
        t0 = time.perf_counter()
        claimed = self.coordinator.claim(planned.id)
        committable = self.writer.stage(frame, claimed, run_partition_writers)
        self.coordinator.prepare(claimed, committable, records, records)
        t1 = time.perf_counter()
        self.coordinator.commit(planned.id)
        t2 = time.perf_counter()
        return {"write": t1 - t0, "notify": t2 - t1, "total": t2 - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    use_prefetched_connector()
    work = Path(tempfile.mkdtemp(prefix="bench-parquet-s3-"))
    with LocalObjectStorage(work / "s3") as server:
        os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(server.connection())
        bucket = server.create_bucket("bench")
        spark = build_spark_session("bench-parquet-s3", {"spark.master": "local[2]", **s3a_conf(server)})
        try:
            from pyspark.sql import functions as F

            frame = (spark.range(args.records, numPartitions=args.partitions)
                     .select(F.col("id").cast("string").alias("key"),
                             F.concat(F.sha2(F.col("id").cast("string"), 256), F.lit("-" * 36)).alias("value"),
                             F.col("id").alias("n")).cache())
            frame.count()
            ours, spark_side = Sink(work, bucket, "ours"), []
            rounds = []
            for i in range(args.repeat):
                result = ours.batch(frame, args.records)
                rounds.append(result)
                print(f"round {i + 1}: ours write {result['write']:.2f} s + notify {result['notify']:.2f} s = "
                      f"{result['total']:.2f} s", flush=True)
                spark_side.append(spark_write(frame, f"s3a://{bucket}/spark/round-{i}"))
            ours_median = statistics.median(r["total"] for r in rounds)
            print(f"{args.records:,} records, {args.partitions} files: ours {ours_median:.2f} s (median); load "
                  f"average {os.getloadavg()[0]:.1f}")
            if all(t is not None for t in spark_side):
                spark_median = statistics.median(t for t in spark_side if t is not None)
                print(f"Spark's df.write.parquet(s3a://) {spark_median:.2f} s (median); ratio "
                      f"{ours_median / spark_median:.2f}x (goal <= 1.2x)")

            small = spark.range(12_000, numPartitions=12).select(F.col("id").cast("string").alias("value")).cache()
            small.count()
            twelve = Sink(work, bucket, "twelve")
            notify = [twelve.batch(small, 12_000)["notify"] for _ in range(args.repeat)]
            print(f"notify_complete of a 12-file batch: median {statistics.median(notify) * 1000:.0f} ms "
                  f"(goal < 1 s; rounds: {', '.join(f'{n * 1000:.0f}' for n in notify)} ms); load average "
                  f"{os.getloadavg()[0]:.1f}")
        finally:
            stop_spark(spark)


if __name__ == "__main__":
    main()
