"""One large batch (20M records by default) against a small one: the driver's memory stays flat.

A batch's records never pass through the driver: Spark's executors read the planned range and write
it, and the driver keeps only counts (Observations) and the sink's commit messages. This measures
that on the real broker of devtools/kafka_broker.py with the Parquet sink: for each size (2M and
20M by default) one exactly-once batch (plan, write, notify_complete) in one warm local SparkSession,
while a sampler reads, every 0.2 s, the driver JVM's used heap (after the write: also after a full
GC) and resident memory, and this Python process's resident memory. In local mode the driver JVM is
also the executor, so its heap holds the tasks' buffers too: what must not grow with the batch is
the peak, beside Spark's own read + write of the same range (same session, same sampler).

Prints per size: records, seconds, records/s, peak JVM heap, peak JVM and Python resident memory,
for ours and for Spark's read + write, the ratio of the large batch's peaks to the small one's, and
the load average.

    PYTHONPATH=. python benchmarks/bench_big_batch.py [--sizes 2000000 20000000] [--size 100]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

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
MB = 1024 * 1024


def produce(bootstrap: str, topic: str, records: int, size: int) -> None:
    """`records` values of `size` bytes, round robin over the partitions, from a process of its own (librdkafka's
    queue would stay in this one's resident memory, which is measured)."""
    subprocess.run([sys.executable, __file__, "--produce", bootstrap, topic, str(records), str(size)], check=True)


def produce_here(bootstrap: str, topic: str, records: int, size: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 2_000_000, "compression.type": "none"})
    value = b"x" * size
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(300) == 0


class Sampler:
    """Peaks of the driver JVM's used heap and resident memory and of this process's, every `every` seconds."""

    def __init__(self, spark, every: float = 0.2) -> None:
        from pyspark import SparkContext

        self.runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
        self.jvm = psutil.Process(SparkContext._gateway.proc.pid)
        self.me = psutil.Process()
        self.every = every
        self.peak = {"heap": 0, "jvm_rss": 0, "python_rss": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        heap = self.runtime.totalMemory() - self.runtime.freeMemory()
        for key, value in (("heap", heap), ("jvm_rss", self.jvm.memory_info().rss),
                           ("python_rss", self.me.memory_info().rss)):
            self.peak[key] = max(self.peak[key], value)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def full_gc_heap(spark) -> int:
    """The driver JVM's used heap after a full GC: what it still holds."""
    jvm = spark.sparkContext._jvm
    jvm.java.lang.System.gc()
    time.sleep(0.5)
    runtime = jvm.java.lang.Runtime.getRuntime()
    return runtime.totalMemory() - runtime.freeMemory()


def ours(spark, work: Path, bootstrap: str, topic: str, n: int) -> dict:
    config = checked(PipelineConfig(pipeline_id=f"big-{n}", topics=[topic], bootstrap_servers=bootstrap,
                                    sink={"type": "parquet", "path": str(work / f"eo-{n}")}))
    coordinator = BatchCoordinator(config, Ledger(f"sqlite:///{work / 'ledger.db'}"), create_committer(config.sink))
    with Sampler(spark) as sampler:
        t0 = time.perf_counter()
        batch = plan_batch(coordinator, lambda: KafkaOffsetSource(KafkaSettings.of(config)), f"run-{n}").batch
        summary = run_write(spark, coordinator, batch.id)
        coordinator.commit(batch.id)
        seconds = time.perf_counter() - t0
    return {"records": summary["output_records"], "seconds": seconds, **sampler.peak,
            "heap_after_gc": full_gc_heap(spark), "batch": batch, "config": config}


def spark_read_write(spark, work: Path, batch, config, n: int) -> dict:
    options = kafka_read_options(batch, config)
    options.pop("kafka.isolation.level")
    # a group of Spark's own: ours reads the pooled reader group with other settings, which Spark's
    # consumer cache refuses for the same group ("Kafka parameters for same cache key should be equal")
    options.pop("kafka.group.id")
    with Sampler(spark) as sampler:
        t0 = time.perf_counter()
        spark.read.format("kafka").options(**options).load().write.parquet(str(work / f"plain-{n}"))
        seconds = time.perf_counter() - t0
    return {"records": batch.offset_span, "seconds": seconds, **sampler.peak, "heap_after_gc": full_gc_heap(spark)}


def main() -> None:
    if sys.argv[1:2] == ["--produce"]:
        bootstrap, topic, records, size = sys.argv[2:6]
        produce_here(bootstrap, topic, int(records), int(size))
        return
    use_prefetched_connector()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000_000, 20_000_000])
    parser.add_argument("--size", type=int, default=100, help="bytes per record value")
    args = parser.parse_args()

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="aeo-bench-big-"))
    broker = LocalKafkaBroker(work / "kafka").start()
    spark = build_spark_session("bench-big-batch", {"spark.master": "local[*]"})
    spark.sparkContext.setLogLevel("ERROR")
    results = {}
    try:
        produce(broker.bootstrap_servers, "warm-up", 100_000, args.size)  # JIT and class loading, not reported
        warm = ours(spark, work, broker.bootstrap_servers, "warm-up", -1)
        spark_read_write(spark, work, warm["batch"], warm["config"], -1)
        for n, records in enumerate(args.sizes):
            topic = f"big-{n}"
            t0 = time.perf_counter()
            produce(broker.bootstrap_servers, topic, records, args.size)
            print(f"produced {records:,} records in {time.perf_counter() - t0:.0f} s", flush=True)
            mine = ours(spark, work, broker.bootstrap_servers, topic, n)
            theirs = spark_read_write(spark, work, mine["batch"], mine["config"], n)
            results[records] = (mine, theirs)
            for label, r in (("ours", mine), ("spark", theirs)):
                print(f"{records:>11,} {label:<6} {r['seconds']:7.1f} s {r['records'] / r['seconds']:>9,.0f} rec/s  "
                      f"peak heap {r['heap'] / MB:6.0f} MB (after GC {r['heap_after_gc'] / MB:4.0f})  peak RSS "
                      f"JVM {r['jvm_rss'] / MB:6.0f} MB, Python {r['python_rss'] / MB:5.0f} MB", flush=True)
            shutil.rmtree(work / f"eo-{n}", ignore_errors=True)
            shutil.rmtree(work / f"plain-{n}", ignore_errors=True)
    finally:
        stop_spark(spark)
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    small, large = min(results), max(results)
    print(f"\nload average {load_before[0]:.1f} before, {load_after[0]:.1f} after; {PARTITIONS} partitions, local[*], "
          f"{args.size}-byte records")
    for index, label in ((0, "ours"), (1, "spark")):
        a, b = results[small][index], results[large][index]
        print(f"{label:<6} {large:,} vs {small:,} records: peak heap {b['heap'] / a['heap']:.2f}x, after GC "
              f"{b['heap_after_gc'] / a['heap_after_gc']:.2f}x, JVM RSS {b['jvm_rss'] / a['jvm_rss']:.2f}x, Python RSS "
              f"{b['python_rss'] / a['python_rss']:.2f}x")


if __name__ == "__main__":
    main()
