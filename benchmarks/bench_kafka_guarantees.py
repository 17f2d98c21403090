"""Throughput of the Kafka sink under NONE, AT_LEAST_ONCE and EXACTLY_ONCE, side by side.

One run: a local Kafka broker (or --bootstrap), one input topic with --records records of
--size bytes, then for each guarantee, in interleaved rounds (rotating which goes first), a
fresh pipeline and output topic processing the *same* offset range in one batch: plan, write (Spark reads the range and
the sink writes it), notify_complete (commit). Throughput = records / (write + commit).
Prints the median of --repeats rounds per guarantee and its ratio to AT_LEAST_ONCE.

    python benchmarks/bench_kafka_guarantees.py                 # 1,000,000 x 100 bytes, 3 rounds
    python benchmarks/bench_kafka_guarantees.py --records 100000 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from devtools.maven import use_prefetched_connector

GUARANTEES = ("EXACTLY_ONCE", "AT_LEAST_ONCE", "NONE")


def produce_input(bootstrap: str, topic: str, records: int, size: int, partitions: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=256 * 1024,
                             enable_idempotence=False)
    for i in range(records):
        key = str(i).encode()
        producer.send(topic, key=key, value=key.rjust(size, b"x"), partition=i % partitions)
    producer.flush()
    producer.close()


def end_offsets(bootstrap: str, topic: str, isolation: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation)
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return sum(consumer.end_offsets(tps).values())
    finally:
        consumer.close()


def passthrough(df):
    return df.select("key", "value")


def one_round(spark, bootstrap: str, source: str, guarantee: str, partitions: int, workdir: Path) -> dict:
    from kafka.admin import KafkaAdminClient, NewTopic

    from airflow_exactly_once.core.config import PipelineConfig
    from airflow_exactly_once.core.ledger import Ledger
    from airflow_exactly_once.core.planning import plan_batch
    from airflow_exactly_once.core.protocol import BatchCoordinator
    from airflow_exactly_once.sinks import create_sink
    from airflow_exactly_once.sources.kafka_offsets import KafkaOffsetSource
    from airflow_exactly_once.spark.job import run_write

    name = f"bench-{guarantee.lower().replace('_', '-')}-{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(f"{name}-out", partitions, 1)])
    admin.close()
    config = PipelineConfig(pipeline_id=name, topics=[source], bootstrap_servers=bootstrap, guarantee=guarantee,
                            sink={"type": "kafka", "topic": f"{name}-out", "transaction_timeout_ms": 900_000,
                                  "producer_config": {"linger_ms": 20, "batch_size": 256 * 1024}}).validate()
    ledger = Ledger(f"sqlite:///{workdir / name}.db")
    coordinator = BatchCoordinator(config, ledger, create_sink(config.sink))
    batch_id = plan_batch(coordinator, lambda: KafkaOffsetSource(config.kafka()), "bench").batch.id
    started = time.perf_counter()
    summary = run_write(spark, coordinator, batch_id, transform=passthrough)
    written = time.perf_counter()
    coordinator.commit(batch_id)
    committed = time.perf_counter()
    handles = ledger.get_batch(batch_id).handles
    markers = sum(len(w["transaction"]["partitions"]) for w in handles["writers"] if w["transaction"])
    in_log = end_offsets(bootstrap, f"{name}-out", "read_uncommitted") - markers
    return {"guarantee": guarantee, "records": summary["output_records"], "in_log": in_log,
            "write_s": written - started, "commit_s": committed - written,
            "records_per_s": summary["output_records"] / (committed - started)}


def main() -> None:
    use_prefetched_connector()  # the Kafka connector jars fetched by `make setup`
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="bytes per record value")
    parser.add_argument("--partitions", type=int, default=4, help="input and output partitions")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per guarantee (interleaved)")
    parser.add_argument("--bootstrap", help="an existing broker; default: start a local one")
    parser.add_argument("--spark-master", default="local[*]")
    args = parser.parse_args()

    from kafka.admin import KafkaAdminClient, NewTopic

    from devtools.kafka_broker import LocalKafkaBroker
    from airflow_exactly_once.spark.session import build_spark_session

    workdir = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    broker = None
    if not args.bootstrap:
        broker = LocalKafkaBroker(workdir / "kafka").start()
    bootstrap = args.bootstrap or broker.bootstrap_servers
    spark = build_spark_session("bench-kafka-guarantees", {"spark.master": args.spark_master})
    try:
        source = f"bench-in-{uuid.uuid4().hex[:6]}"
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.create_topics([NewTopic(source, args.partitions, 1)])
        admin.close()
        print(f"producing {args.records:,} records of {args.size} bytes into {source} ...", flush=True)
        produce_input(bootstrap, source, args.records, args.size, args.partitions)
        rounds = []
        for n in range(args.repeats):
            for guarantee in GUARANTEES[n % 3:] + GUARANTEES[:n % 3]:  # each goes first once (JVM warm-up)
                result = one_round(spark, bootstrap, source, guarantee, args.partitions, workdir)
                print(f"round {n + 1} {guarantee:<14} write {result['write_s']:7.1f} s  commit "
                      f"{result['commit_s']:5.2f} s  {result['records_per_s']:>9,.0f} records/s  "
                      f"(records in the output log: {result['in_log']:,})", flush=True)
                rounds.append(result)
    finally:
        spark.stop()
        if broker is not None:
            broker.stop()

    medians = {g: statistics.median(r["records_per_s"] for r in rounds if r["guarantee"] == g) for g in GUARANTEES}
    print(f"\nmedian of {args.repeats} round(s), {args.records:,} records of {args.size} bytes, "
          f"{args.partitions} partitions, Spark {args.spark_master}:")
    print(f"{'guarantee':<14} {'records/s':>10} {'vs AT_LEAST_ONCE':>17}")
    for guarantee in GUARANTEES:
        print(f"{guarantee:<14} {medians[guarantee]:>10,.0f} {medians[guarantee] / medians['AT_LEAST_ONCE']:>16.2f}x")
    print(json.dumps({"medians_records_per_s": medians, "rounds": rounds}))


if __name__ == "__main__":
    main()
