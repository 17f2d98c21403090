"""One exactly-once micro-batch into Parquet vs Spark's own at-least-once read + write.

Both sides read the same offset range of the same topic with the same warm local
SparkSession and write Parquet; ours adds planning (ledger + Kafka offsets), staging and
the atomic publish. Prints each repetition and the medians side by side.

    .venv/bin/python benchmarks/bench_parquet_batch.py [--records 100000] [--repeat 5]
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
from devtools.kafka_broker import LocalKafkaBroker
from airflow_exactly_once.sinks import create_sink
from airflow_exactly_once.sources.kafka_offsets import KafkaOffsetSource
from airflow_exactly_once.spark.job import kafka_read_options, run_write
from airflow_exactly_once.spark.session import build_spark_session
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
    config = PipelineConfig(pipeline_id=f"bench-{n}", topics=[topic], bootstrap_servers=bootstrap,
                            sink={"type": "parquet", "path": str(work / f"eo-{n}")}).validate()
    ledger = Ledger(f"sqlite:///{work / 'ledger.db'}")
    coordinator = BatchCoordinator(config, ledger, create_sink(config.sink))
    t0 = time.perf_counter()
    batch = plan_batch(coordinator, lambda: KafkaOffsetSource(config.kafka()), f"run-{n}").batch
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
    t0 = time.perf_counter()
    spark.read.format("kafka").options(**options).load().write.mode("overwrite").parquet(str(work / f"plain-{n}"))
    return time.perf_counter() - t0


def main() -> None:
    use_prefetched_connector()  # the Kafka connector jars fetched by `make setup`
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="aeo-bench-"))
    broker = LocalKafkaBroker(work / "kafka").start()
    try:
        produce(broker.bootstrap_servers, "bench", args.records, args.size)
        spark = build_spark_session("bench", {"spark.master": "local[*]"})
        spark.sparkContext.setLogLevel("ERROR")
        ours, plain = [], []
        # Warm-up of both paths (JIT, connector class loading), not measured.
        warm = exactly_once_batch(spark, work, broker.bootstrap_servers, "bench", 0)
        spark_baseline(spark, work, warm["_batch"], warm["_config"], 0)
        for n in range(1, args.repeat + 1):
            result = exactly_once_batch(spark, work, broker.bootstrap_servers, "bench", n)
            baseline = spark_baseline(spark, work, result["_batch"], result["_config"], n)
            ours.append(result)
            plain.append(baseline)
            print(f"rep {n}: exactly-once plan={result['plan']:.3f}s write={result['write']:.3f}s "
                  f"notify_complete={result['notify_complete']:.3f}s total={result['total']:.3f}s | "
                  f"spark at-least-once read+write={baseline:.3f}s", flush=True)
        spark.stop()
        med = {k: statistics.median(r[k] for r in ours) for k in ("plan", "write", "notify_complete", "total")}
        base = statistics.median(plain)
        print(f"\n{args.records} records x {args.size} bytes, {PARTITIONS} partitions, local[*], "
              f"median of {args.repeat}:")
        print(f"  {'step':<34}{'seconds':>9}")
        for key in ("plan", "write", "notify_complete", "total"):
            print(f"  exactly-once {key:<21}{med[key]:>9.3f}")
        print(f"  spark read+write (at-least-once) {base:>9.3f}")
        print(f"  ratio exactly-once total / baseline: {med['total'] / base:.2f}x "
              f"(write step alone: {med['write'] / base:.2f}x)")
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
