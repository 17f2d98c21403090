"""Kafka -> Kafka: the exactly-once sink (three guarantees) against Spark's own Kafka writer, in one run.

A local broker (or --bootstrap), one input topic of --records records of --size bytes, then in
rounds that rotate which contender goes first (JVM warm-up, page cache), each contender
writes the *same* offset range to a fresh output topic with as many partitions as the input:

* `spark`: Spark's own batch writer, `df.write.format("kafka")` of Spark's own Kafka read of
  the range (what a user without this package would write: at least once, no transaction);
* `EXACTLY_ONCE`, `AT_LEAST_ONCE`, `NONE`: this package's write step (claim, Spark reads the
  range, the sink writes, PREPARED) plus notify_complete (the commit);
* `spark_read`: Spark's read of the range alone, into Spark's `noop` format: the floor of every
  writer that starts from Spark's Kafka source, so "CPU s beyond the read" is what each writer's
  own work costs (what a faster writer could still win).

Throughput = records / seconds of the write (+ commit). A warm-up round (--warmup) runs first, uncounted.
Beside the seconds, each run's CPU seconds (user + system, from /proc) of the broker, of Spark's JVM and of
the JVM's Python workers (the sink's writers): on a machine whose cores are all busy, the contender that
burns less CPU per record is the faster one. Prints every round, the median of the
rounds per contender, its ratio to Spark's writer, and the load average before and after.

    PYTHONPATH=. python benchmarks/bench_kafka_sink.py                  # 1,000,000 x 100 bytes, 3 rounds
    PYTHONPATH=. python benchmarks/bench_kafka_sink.py --records 100000 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import confluent_kafka
from kafka import KafkaConsumer, TopicPartition
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

CONTENDERS = ("spark", "EXACTLY_ONCE", "AT_LEAST_ONCE", "NONE", "spark_read")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU seconds of a process (with `children`: of its reaped children, not itself)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    used = fields[13:15] if children else fields[11:13]
    return sum(int(f) for f in used) / CLOCK_TICKS


def descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            pass
    return found + [d for c in found for d in descendants(c)]


class CpuMeter:
    """CPU seconds of the broker, Spark's JVM and the JVM's Python workers (live and exited) since the last call."""

    def __init__(self, broker_pid: int | None, jvm_pid: int) -> None:
        self.broker_pid, self.jvm_pid = broker_pid, jvm_pid
        self.last = self._now()

    def _now(self) -> dict[str, float]:
        workers = cpu_seconds(self.jvm_pid, children=True)
        for pid in descendants(self.jvm_pid):
            try:
                workers += cpu_seconds(pid) + cpu_seconds(pid, children=True)
            except FileNotFoundError:  # exited meanwhile: counted with the reaped children next time
                pass
        return {"broker": cpu_seconds(self.broker_pid) if self.broker_pid else 0.0,
                "spark_jvm": cpu_seconds(self.jvm_pid), "python_workers": workers}

    def lap(self) -> dict[str, float]:
        now = self._now()
        used = {k: round(now[k] - self.last[k], 2) for k in now}
        self.last = now
        return used


def produce_input(bootstrap: str, topic: str, records: int, size: int, partitions: int) -> None:
    """The input, with librdkafka (kafka-python's pure-Python producer took over 5 minutes for 10M records)."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 20,
                                         "batch.size": 256 * 1024, "enable.idempotence": False})
    for i in range(records):
        key = str(i).encode()
        while True:
            try:
                producer.produce(topic, key.rjust(size, b"x"), key, partition=i % partitions)
                break
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.05)
    if producer.flush(300):
        raise RuntimeError(f"the input of {topic} was not all delivered")


def records_in(bootstrap: str, topic: str) -> int:
    """Records visible under read_committed (end offsets, minus nothing: used for plain topics only)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return sum(consumer.end_offsets(tps).values())
    finally:
        consumer.close()


def new_topic(bootstrap: str, name: str, partitions: int, timeout: float = 30.0) -> str:
    """A new topic, returned once every partition has a leader.

    Spark's cached idempotent producer, sent NOT_LEADER_OR_FOLLOWER by a partition whose leader
    is still being elected, restarted its sequence at 0 and was refused OUT_OF_ORDER_SEQUENCE_NUMBER
    for minutes (seen in this benchmark): writing only after the election keeps the baseline fair.
    """
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
        deadline = time.monotonic() + timeout
        while True:
            described = admin.describe_topics([name])
            leaders = [p.get("leader_id", p.get("leader", -1)) for t in described for p in t.get("partitions") or ()]
            if len(leaders) == partitions and all(leader >= 0 for leader in leaders):
                return name
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {name}: no leader for every partition after {timeout:.0f} s: {described}")
            time.sleep(0.1)
    finally:
        admin.close()


def passthrough(df):
    return df.select("key", "value")


def ours(spark, bootstrap: str, source: str, guarantee: str, partitions: int, workdir: Path,
         producer_config: dict | None = None) -> dict:
    name = f"bench-{guarantee.lower().replace('_', '-')}-{uuid.uuid4().hex[:6]}"
    output = new_topic(bootstrap, f"{name}-out", partitions)
    config = checked(PipelineConfig(pipeline_id=name, topics=[source], bootstrap_servers=bootstrap, guarantee=guarantee,
                            sink={"type": "kafka", "topic": output, "transaction_timeout_ms": 900_000,
                                  "producer_config": producer_config or {}}))
    coordinator = BatchCoordinator(config, Ledger(f"sqlite:///{workdir / name}.db"), create_committer(config.sink))
    batch_id = plan_batch(coordinator, lambda: KafkaOffsetSource(KafkaSettings.of(config)), "bench").batch.id
    started = time.perf_counter()
    summary = run_write(spark, coordinator, batch_id, transform=passthrough)
    written = time.perf_counter()
    coordinator.commit(batch_id)
    committed = time.perf_counter()
    return {"contender": guarantee, "records": summary["output_records"], "write_s": written - started,
            "commit_s": committed - written, "seconds": committed - started}


def spark_frame(spark, range_batch, config):
    """Spark's own read of the range, with Spark's default isolation."""
    options = kafka_read_options(range_batch, config)
    options.pop("kafka.isolation.level")
    # a group of Spark's own: ours reads the pooled reader group with other settings, which Spark's
    # consumer cache refuses for the same group ("Kafka parameters for same cache key should be equal")
    options.pop("kafka.group.id")
    return spark.read.format("kafka").options(**options).load().select("key", "value")


def spark_writer(spark, bootstrap: str, range_batch, config, partitions: int) -> dict:
    output = new_topic(bootstrap, f"bench-spark-{uuid.uuid4().hex[:6]}", partitions)
    started = time.perf_counter()
    spark_frame(spark, range_batch, config).write.format("kafka").option("kafka.bootstrap.servers", bootstrap) \
        .option("topic", output).save()
    seconds = time.perf_counter() - started
    return {"contender": "spark", "records": records_in(bootstrap, output), "write_s": seconds, "commit_s": 0.0,
            "seconds": seconds}


def spark_read(spark, range_batch, config) -> dict:
    """The read alone (Spark's `noop` sink consumes every row and writes nothing)."""
    started = time.perf_counter()
    spark_frame(spark, range_batch, config).write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - started
    return {"contender": "spark_read", "records": range_batch.offset_span, "write_s": seconds, "commit_s": 0.0,
            "seconds": seconds}


def main() -> None:
    use_prefetched_connector()  # the Kafka connector jars fetched by `make setup`
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100, help="bytes per record value")
    parser.add_argument("--partitions", type=int, default=4, help="input and output partitions")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (each contender once per round, rotated)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="rounds run first and not counted (the first write of a JVM takes 2-4x as long)")
    parser.add_argument("--bootstrap", help="an existing broker; default: start a local one")
    parser.add_argument("--spark-master", default="local[*]")
    parser.add_argument("--producer-config", type=json.loads, default={},
                        help='the sink\'s producer_config for our contenders, JSON, e.g. \'{"linger.ms": 100}\'')
    args = parser.parse_args()

    load_before = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="bench-kafka-sink-"))
    broker = None if args.bootstrap else LocalKafkaBroker(workdir / "kafka").start()
    bootstrap = args.bootstrap or broker.bootstrap_servers
    spark = build_spark_session("bench-kafka-sink", {"spark.master": args.spark_master})
    meter = CpuMeter(broker.process.pid if broker is not None else None,
                     int(spark.sparkContext._jvm.ProcessHandle.current().pid()))
    try:
        source = new_topic(bootstrap, f"bench-in-{uuid.uuid4().hex[:6]}", args.partitions)
        print(f"producing {args.records:,} records of {args.size} bytes into {source} ...", flush=True)
        produce_input(bootstrap, source, args.records, args.size, args.partitions)
        # The range every contender writes: the whole input, as the exactly-once plan fixes it.
        reference = checked(PipelineConfig(pipeline_id="bench-range", topics=[source], bootstrap_servers=bootstrap,
                                   sink={"type": "parquet", "path": str(workdir / "unused")}))
        range_batch = plan_batch(BatchCoordinator(reference, Ledger(f"sqlite:///{workdir}/range.db"),
                                                  create_committer(reference.sink)),
                                 lambda: KafkaOffsetSource(KafkaSettings.of(reference)), "range").batch
        rounds = []
        for n in range(-args.warmup, args.repeats):
            turn = n % len(CONTENDERS)
            for contender in CONTENDERS[turn:] + CONTENDERS[:turn]:
                if contender == "spark":
                    result = spark_writer(spark, bootstrap, range_batch, reference, args.partitions)
                elif contender == "spark_read":
                    result = spark_read(spark, range_batch, reference)
                else:
                    result = ours(spark, bootstrap, source, contender, args.partitions, workdir, args.producer_config)
                result["records_per_s"] = result["records"] / result["seconds"]
                result["cpu_s"] = meter.lap()
                label = "warm-up" if n < 0 else f"round {n + 1}"
                print(f"{label:<8} {contender:<14} write {result['write_s']:7.2f} s  commit "
                      f"{result['commit_s']:5.2f} s  {result['records']:>9,} records  "
                      f"{result['records_per_s']:>9,.0f} records/s  CPU s: "
                      + "  ".join(f"{k} {v:.2f}" for k, v in result["cpu_s"].items()), flush=True)
                if n >= 0:
                    rounds.append(result)
    finally:
        stop_spark(spark)
        if broker is not None:
            broker.stop()

    medians = {c: statistics.median(r["records_per_s"] for r in rounds if r["contender"] == c) for c in CONTENDERS}
    load_after = os.getloadavg()
    print(f"\nmedian of {args.repeats} round(s), {args.records:,} records of {args.size} bytes, {args.partitions} "
          f"partitions, Spark {args.spark_master}; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after:")
    cpu = {c: statistics.median(sum(r["cpu_s"].values()) for r in rounds if r["contender"] == c) for c in CONTENDERS}
    print(f"{'contender':<14} {'records/s':>10} {'vs Spark writer':>16} {'CPU s (all)':>12} {'vs Spark':>9} "
          f"{'CPU s beyond the read':>22}")
    for contender in CONTENDERS:
        print(f"{contender:<14} {medians[contender]:>10,.0f} {medians[contender] / medians['spark']:>15.2f}x "
              f"{cpu[contender]:>12.2f} {cpu[contender] / cpu['spark']:>8.2f}x "
              f"{cpu[contender] - cpu['spark_read']:>22.2f}")
    print(json.dumps({"medians_records_per_s": medians, "load": [load_before, load_after], "rounds": rounds}))


if __name__ == "__main__":
    main()
