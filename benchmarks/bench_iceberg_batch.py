"""One exactly-once micro-batch into Apache Iceberg vs Spark's own `df.writeTo(table).append()`.

Both sides read the same offset range of the same topic (1,000,000 records by default) with the
same warm local SparkSession, apply the same transform and append it to an Iceberg table of the
same catalog: the embedded one, or (`--catalog rest`) Iceberg's own REST catalog server
(devtools.iceberg_rest), which both Spark and pyiceberg then reach over HTTP. `--warehouse s3` puts the
table's files on an S3-compatible server (devtools.object_storage: s3proxy), Spark writing with Iceberg's
S3FileIO and pyiceberg with pyarrow's S3, credentials from an Airflow `aws` connection (the REST server
writes its metadata there too). Ours adds planning (ledger +
Kafka offsets), staging the snapshot (WAP) and notify_complete (pyiceberg publishes it to main, no Spark;
goal with the REST catalog: under 0.5 s). Rounds alternate which side goes first; prints each round, the
medians and the throughput ratio (Spark's time / ours: 1.0 = as fast as Spark).

    python benchmarks/bench_iceberg_batch.py [--records 1000000] [--rounds 3] [--catalog embedded|rest]
                                             [--warehouse disk|s3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.planning import plan_batch
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import create_committer, create_writer
from airflow_exactly_once.spark.batch_read import kafka_read_options
from airflow_exactly_once.spark.in_process_session import build_spark_session, stop_spark
from airflow_exactly_once.spark.write_job import run_write
from benchmarks.bench_parquet_batch import PARTITIONS, produce
from devtools.iceberg_rest import LocalIcebergRestCatalog
from devtools.kafka_broker import LocalKafkaBroker
from devtools.maven import use_prefetched_connector
from devtools.object_storage import SDK_CHECKSUM_ENV, LocalObjectStorage

TRANSFORM = "benchmarks.bench_iceberg_batch:as_rows"
LAKE_CONN_ID = "bench_lake"  # the Airflow `aws` connection of the s3 warehouse (AIRFLOW_CONN_BENCH_LAKE)


def as_rows(df):
    """The transform of both sides: value as text, plus where each record came from."""
    return df.selectExpr("CAST(value AS STRING) AS value", "partition", "offset")


def sink_spec(work: Path, rest: LocalIcebergRestCatalog | None, s3_warehouse: str | None = None) -> dict:
    """The benchmark's table in the embedded catalog, or in the REST catalog (which places its files itself); on
    `s3_warehouse` (its files on object storage, the embedded catalog's file in `work`) when given."""
    storage = {"warehouse": s3_warehouse, "aws_conn_id": LAKE_CONN_ID} if s3_warehouse else {}
    if rest is None:
        catalog = {"catalog": {"path": str(work / "catalog.sqlite")}} if s3_warehouse else {}
        return {"type": "iceberg", "table": "bench.exactly_once", "warehouse": str(work / "lake"), **storage,
                **catalog}
    return {"type": "iceberg", "table": "bench.exactly_once", "catalog": {"type": "rest", "uri": rest.uri},
            **storage}


def object_storage(work: Path) -> tuple[LocalObjectStorage, str]:
    """s3proxy with a bucket for the warehouse, its `aws` connection in this process's environment, and Java's AWS SDK
    set to the checksums s3proxy takes (before any JVM starts): (server, warehouse)."""
    server = LocalObjectStorage(work / "s3").start()
    os.environ.update(SDK_CHECKSUM_ENV)
    os.environ[f"AIRFLOW_CONN_{LAKE_CONN_ID.upper()}"] = json.dumps(server.connection())
    return server, f"s3://{server.create_bucket('lake')}/warehouse"


def exactly_once_batch(spark, work: Path, bootstrap: str, topic: str, n: int,
                       rest: LocalIcebergRestCatalog | None = None, s3_warehouse: str | None = None) -> dict:
    config = checked(PipelineConfig(pipeline_id=f"bench-{n}", topics=[topic], bootstrap_servers=bootstrap,
                            transform=TRANSFORM, sink={**sink_spec(work, rest, s3_warehouse), "create_table": True}))
    ledger = Ledger(f"sqlite:///{work / 'ledger.db'}")
    coordinator = BatchCoordinator(config, ledger, create_committer(config.sink))
    t0 = time.perf_counter()
    batch = plan_batch(coordinator, lambda: KafkaOffsetSource(KafkaSettings.of(config)), f"run-{n}").batch
    t1 = time.perf_counter()
    summary = run_write(spark, coordinator, batch.id)
    t2 = time.perf_counter()
    BatchCoordinator(config, ledger, create_committer(config.sink)).commit(batch.id)  # as notify_complete: a new sink
    t3 = time.perf_counter()
    return {"plan": t1 - t0, "write": t2 - t1, "notify_complete": t3 - t2, "total": t3 - t0,
            "records": summary["output_records"], "_batch": batch, "_config": config}


def spark_append(spark, batch, config, table: str) -> tuple[float, int]:
    """Spark's own Kafka batch read of the same range, transformed the same way, `writeTo(table).append()`."""
    options = kafka_read_options(batch, config)
    options.pop("kafka.isolation.level")  # the plain default read
    # a group of Spark's own: ours reads the pooled reader group with other settings, which Spark's
    # consumer cache refuses for the same group ("Kafka parameters for same cache key should be equal")
    options.pop("kafka.group.id")
    t0 = time.perf_counter()
    frame = as_rows(spark.read.format("kafka").options(**options).load())
    frame.writeTo(table).append()
    seconds = time.perf_counter() - t0
    return seconds, batch.offset_span


def main() -> None:
    use_prefetched_connector()  # Kafka's connector and Iceberg's runtime, fetched in advance
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--catalog", choices=["embedded", "rest"], default="embedded")
    parser.add_argument("--warehouse", choices=["disk", "s3"], default="disk")
    args = parser.parse_args()
    load = os.getloadavg()

    work = Path(tempfile.mkdtemp(prefix="aeo-bench-iceberg-"))
    broker = LocalKafkaBroker(work / "kafka").start()
    storage, s3_warehouse = object_storage(work) if args.warehouse == "s3" else (None, None)
    rest_settings = {"properties": storage.iceberg_properties(s3_warehouse), "env": SDK_CHECKSUM_ENV} if storage else {}
    rest = LocalIcebergRestCatalog(work / "rest-catalog", **rest_settings).start() if args.catalog == "rest" else None
    spark = None
    try:
        produce(broker.bootstrap_servers, "bench", args.records, args.size)
        sink = create_writer(sink_spec(work, rest, s3_warehouse))
        spark = build_spark_session("bench-iceberg", {"spark.master": "local[*]", "spark.driver.memory": "2g"},
                                    packages=sink.spark_packages())
        spark.sparkContext.setLogLevel("ERROR")
        baseline_table = f"{sink.target.catalog.name}.bench.spark_append"
        # Warm-up of both paths (JIT, class loading, table creation), not measured.
        warm = exactly_once_batch(spark, work, broker.bootstrap_servers, "bench", 0, rest, s3_warehouse)
        spark.sql(f"CREATE TABLE IF NOT EXISTS {baseline_table} (value STRING, partition INT, offset BIGINT) "
                  "USING iceberg")
        spark_append(spark, warm["_batch"], warm["_config"], baseline_table)
        ours, plain = [], []
        for n in range(1, args.rounds + 1):
            # Every round reads the whole topic (each exactly-once round is a new pipeline); the side that
            # goes first alternates, so neither profits from the other's warm page cache every time.
            if n % 2 == 0:
                baseline, _ = spark_append(spark, warm["_batch"], warm["_config"], baseline_table)
            result = exactly_once_batch(spark, work, broker.bootstrap_servers, "bench", n, rest, s3_warehouse)
            if n % 2 == 1:
                baseline, _ = spark_append(spark, warm["_batch"], warm["_config"], baseline_table)
            assert result["records"] == args.records, result["records"]
            ours.append(result)
            plain.append(baseline)
            first = "spark" if n % 2 == 0 else "exactly-once"
            print(f"round {n} ({first} first): exactly-once plan={result['plan']:.2f}s write={result['write']:.2f}s "
                  f"notify_complete={result['notify_complete']:.2f}s total={result['total']:.2f}s | "
                  f"spark writeTo().append()={baseline:.2f}s", flush=True)
        med = {k: statistics.median(r[k] for r in ours) for k in ("plan", "write", "notify_complete", "total")}
        base = statistics.median(plain)
        print(f"\n{args.records} records x {args.size} bytes, {PARTITIONS} partitions, local[*], {args.catalog} catalog, "
              f"warehouse on {args.warehouse}, "
              f"median of {args.rounds} rounds (load average 1/5/15 min at the start: "
              f"{load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}, at the end: {os.getloadavg()[0]:.2f}):")
        for key in ("plan", "write", "notify_complete", "total"):
            print(f"  exactly-once {key:<28}{med[key]:>8.2f} s  {args.records / med[key]:>12,.0f} rec/s")
        print(f"  spark writeTo().append() (no 2PC) {base:>8.2f} s  {args.records / base:>12,.0f} rec/s")
        print(f"  throughput ratio exactly-once / spark: {base / med['total']:.2f}x "
              f"(write step alone: {base / med['write']:.2f}x; target >= 0.9x)")
        if rest is not None or storage is not None:
            print(f"  notify_complete ({args.catalog} catalog, warehouse on {args.warehouse}): "
                  f"{med['notify_complete']:.2f} s (goal < 0.5 s); write "
                  f"vs writeTo().append(): {med['write'] / base:.2f}x the time (goal <= 1.1x)")
    finally:
        if spark is not None:
            stop_spark(spark)
        if rest is not None:
            rest.stop()
        if storage is not None:
            storage.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
