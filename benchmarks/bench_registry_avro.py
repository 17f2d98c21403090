"""Avro in the Schema Registry wire format, two schema versions, decoded through the pipeline vs hand-written from_avro.

The topic holds 1M records (by default) written under two versions of one subject (v1, and v2
which adds a field with a default), in the Confluent wire format, on a real registry with basic
auth (devtools.schema_registry). Both sides read the same offset range with the same warm local
SparkSession and write Parquet:

* ours: value_format="avro" with the registry: each record's writer schema by its id, resolved
  to the latest version, bad records counted (none here), staged exactly once (the write step);
* hand-written: what users write today, Spark's own `from_avro` on the bytes with the 5-byte
  prefix cut off and one fixed schema (v1: it reads v2's records without their new field, and v1
  records with v2 would fail to decode, which is why it is not enough; it is the throughput to beat).

Prints each round, the medians, the ratio of throughputs (goal: ours at least 0.8x) and the load.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_registry_avro.py [--records 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import fastavro
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.planning import plan_batch
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.records.wire_format import frame
from airflow_exactly_once.sinks import create_committer
from airflow_exactly_once.spark.batch_read import kafka_read_options
from airflow_exactly_once.spark.in_process_session import build_spark_session, stop_spark
from airflow_exactly_once.spark.write_job import run_write
from devtools.kafka_broker import LocalKafkaBroker
from devtools.maven import use_prefetched_connector
from devtools.schema_registry import LocalSchemaRegistry

PARTITIONS = 3
V1 = {"type": "record", "name": "Order", "namespace": "bench",
      "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"},
                 {"name": "amount", "type": "double"}]}
V2 = {**V1, "fields": V1["fields"] + [{"name": "note", "type": ["null", "string"], "default": None}]}


def produce(bootstrap: str, registry: dict, topic: str, records: int) -> None:
    """`records` values in the wire format, alternating v1 and v2 (both registered under <topic>-value)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic exists
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)
    client = SchemaRegistryClient(registry)
    ids = [client.register_schema(f"{topic}-value", Schema(json.dumps(s), "AVRO")) for s in (V1, V2)]
    parsed = [fastavro.parse_schema(s) for s in (V1, V2)]
    samples = []
    for i in range(1000):  # encoded once, sent many times: the producer is not what is measured
        version = i % 2
        body = io.BytesIO()
        record = {"id": i, "item": f"item-{i:06d}-{'x' * 40}", "amount": i * 1.5}
        if version:
            record["note"] = f"note-{i}"
        fastavro.schemaless_writer(body, parsed[version], record)
        samples.append(frame(ids[version], body.getvalue()))
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 2_000_000})
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value=samples[i % len(samples)], partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0


def the_fields(df):
    """The record's fields only, as the hand-written side writes them (not Kafka's columns)."""
    return df.select("id", "item", "amount", "note")


def ours(spark, work: Path, bootstrap: str, registry: dict, topic: str, n: int) -> dict:
    config = checked(PipelineConfig(pipeline_id=f"bench-{n}", topics=[topic], bootstrap_servers=bootstrap,
                                    sink={"type": "parquet", "path": str(work / f"eo-{n}")}, value_format="avro",
                                    schema_registry=registry, schema_registry_conn_id="bench"))
    coordinator = BatchCoordinator(config, Ledger(f"sqlite:///{work / 'ledger.db'}"), create_committer(config.sink))
    batch = plan_batch(coordinator, lambda: KafkaOffsetSource(KafkaSettings.of(config)), f"run-{n}").batch
    t0 = time.perf_counter()
    summary = run_write(spark, coordinator, batch.id, transform=the_fields)
    seconds = time.perf_counter() - t0
    assert summary.get("bad_records", 0) == 0, summary
    coordinator.commit(batch.id)
    return {"seconds": seconds, "records": summary["output_records"], "batch": batch, "config": config}


def hand_written(spark, work: Path, batch, config, n: int) -> float:
    """Spark's from_avro after cutting the 5-byte prefix, one fixed schema (v1), straight to Parquet."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    options = kafka_read_options(batch, config)
    t0 = time.perf_counter()
    frame_ = spark.read.format("kafka").options(**options).load()
    decoded = frame_.select(from_avro(F.expr("substring(value, 6)"), json.dumps(V1)).alias("r")).select("r.*")
    decoded.write.mode("overwrite").parquet(str(work / f"plain-{n}"))
    return time.perf_counter() - t0


def main() -> None:
    use_prefetched_connector()  # Kafka's connector and spark-avro, fetched by `make setup`
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="aeo-bench-sr-"))
    broker = LocalKafkaBroker(work / "kafka").start()
    registry_server = LocalSchemaRegistry(work / "registry").start()
    registry = {"url": registry_server.url,
                "basic.auth.user.info": f"{registry_server.user}:{registry_server.password}"}
    spark = build_spark_session("bench-registry", {"spark.master": "local[*]"})  # spark-avro: SPARK_CONF_DIR
    spark.sparkContext.setLogLevel("ERROR")
    topic = "bench-orders"
    mine, theirs = [], []
    try:
        t0 = time.perf_counter()
        produce(broker.bootstrap_servers, registry, topic, args.records)
        print(f"produced {args.records:,} records in {time.perf_counter() - t0:.1f}s", flush=True)
        warm = ours(spark, work, broker.bootstrap_servers, registry, topic, 0)  # JIT and class loading
        hand_written(spark, work, warm["batch"], warm["config"], 0)
        for n in range(1, args.repeat + 1):
            result = ours(spark, work, broker.bootstrap_servers, registry, topic, n)
            baseline = hand_written(spark, work, result["batch"], result["config"], n)
            mine.append(result["seconds"])
            theirs.append(baseline)
            print(f"round {n}: ours write {result['seconds']:.2f}s ({result['records'] / result['seconds']:,.0f} "
                  f"rec/s) | hand-written from_avro {baseline:.2f}s ({args.records / baseline:,.0f} rec/s)",
                  flush=True)
    finally:
        stop_spark(spark)
        registry_server.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    ours_rate, their_rate = args.records / statistics.median(mine), args.records / statistics.median(theirs)
    print(f"\n{args.records:,} Avro records in the wire format (v1 and v2 mixed), {PARTITIONS} partitions, local[*], "
          f"medians of {args.repeat}; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"ours (decode by writer id, resolve to the latest, count bad records, stage): {ours_rate:,.0f} rec/s")
    print(f"hand-written from_avro (prefix cut, one fixed schema):               {their_rate:,.0f} rec/s")
    print(f"ratio: {ours_rate / their_rate:.2f}x (goal: at least 0.8x)")


if __name__ == "__main__":
    main()
