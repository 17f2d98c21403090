"""The rate a pipeline sustains: ours (the freshness DAG on Airflow) against Spark Structured Streaming's own Kafka ->
Kafka query, step by step on the same machine (issue 51, its third goal).

Same stack and topics as benchmarks/bench_freshness.py (Kafka broker, warm Spark Connect server, PostgreSQL, a real
Airflow at its default settings, the backlog-triggered DAG). Each contender gets the same steps, one after the other:
a producer at R records/s for --step-minutes, then the step's figures once its records are visible: p50 / p99
produced-to-visible, the output rate it kept up with (the slope of visibility between 10 % and 90 % of the step's
records), and how the latency moved within the step (the p50 of the step's last quarter minus its first quarter's).
A step is sustained when the output kept up (>= 95 % of R) and the latency did not grow by more than --growth-s
(a backlog that grows by only 10 % of R over two minutes adds twelve seconds). The first step not sustained ends that
contender's search (its records are still drained and checked); the highest sustained R is its sustainable rate.
The producer itself is a Python thread on the same 2 cores: a step it could not produce in time is marked as limited
by the producer, not by the contender. Ours must be exact over all steps (every id visible once), else exit 1.

    PYTHONPATH=. python benchmarks/bench_freshness_rate.py --rates 1000,2000,5000,10000,20000 --step-minutes 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from benchmarks.bench_freshness import (
    SPARK_CONN_ID,
    DagSettings,
    SteadyProducer,
    StreamResult,
    VisibilityConsumer,
    create_topics,
    exactness,
    latency_summary,
    start_airflow,
    stream_result,
    wait_idle,
    wait_visible,
    wait_watching,
)
from devtools.kafka_broker import LocalKafkaBroker
from devtools.spark_connect import LocalSparkConnectServer

KEPT_UP = 0.95  # the output's rate, as a share of R, that counts as keeping up


@dataclass
class Step:
    rate: float
    result: StreamResult
    growth_s: float  # p50 of the step's last quarter (by produce time) minus its first quarter's
    producer_limited: bool  # the producer took over 5 % longer than the step: R was not offered in full
    sustained: bool


def quarter_growth(consumer: VisibilityConsumer, producer: SteadyProducer) -> float:
    """How much the median latency rose from the step's first quarter of records to its last (s)."""
    ids = range(producer.first_id, producer.first_id + producer.produced)
    quarter = max(1, len(ids) // 4)

    def median(part: range) -> float:
        values = [consumer.latency_ms[i] for i in part if i in consumer.latency_ms]
        return latency_summary(values).get("p50", 0.0)

    return median(ids[-quarter:]) - median(ids[:quarter])


def judge(rate: float, result: StreamResult, growth_s: float, producer: SteadyProducer, seconds: float,
          allowed_growth_s: float) -> Step:
    """A step's verdict: sustained when the output kept up with R and the latency did not grow."""
    took = (producer.ended_at or time.time()) - producer.started_at
    limited = took > seconds * 1.05
    kept_up = result.sustained_records_per_s >= KEPT_UP * min(rate, producer.produced / max(took, 1e-9))
    return Step(rate, result, growth_s, limited, kept_up and growth_s <= allowed_growth_s)


def search(name: str, bootstrap: str, topic_in: str, consumer: VisibilityConsumer, rates: list[float],
           seconds: float, first_id: int, drain_timeout: float, allowed_growth_s: float,
           alive: Callable[[], None], settle: Callable[[], None] = lambda: None) -> tuple[list[Step], int]:
    """Step through `rates` until one is not sustained; returns the steps and the next free id."""
    steps: list[Step] = []
    for rate in rates:
        producer = SteadyProducer(bootstrap, topic_in, rate, seconds, first_id=first_id)
        producer.start()
        wait_visible(consumer, producer, seconds + drain_timeout, alive)
        settle()
        first_id += producer.produced
        step = judge(rate, stream_result(name, consumer, producer), quarter_growth(consumer, producer), producer,
                     seconds, allowed_growth_s)
        steps.append(step)
        print_step(name, step)
        if not step.sustained:
            break
    return steps, first_id


def print_step(name: str, step: Step) -> None:
    lat = step.result.latency_s
    verdict = "sustained" if step.sustained else "NOT sustained"
    print(f"{name:<16} R {step.rate:>7.0f}/s  p50 {lat.get('p50', 0):6.2f} s  p99 {lat.get('p99', 0):6.2f} s  "
          f"max {lat.get('max', 0):6.2f} s  output kept up with {step.result.sustained_records_per_s:7.0f}/s  "
          f"latency growth {step.growth_s:+6.1f} s  {verdict}"
          + ("  (the producer could not offer R in time)" if step.producer_limited else ""), flush=True)


def best(steps: list[Step]) -> float:
    return max((s.rate for s in steps if s.sustained), default=0.0)


def measure_ours(work: Path, broker: LocalKafkaBroker, connect: LocalSparkConnectServer, args: argparse.Namespace,
                 seconds: float) -> tuple[list[Step], bool]:
    settings = DagSettings("bench_freshness", "bench_freshness", "fresh_in", "fresh_out", SPARK_CONN_ID, None)
    create_topics(broker.bootstrap_servers, [settings.input_topic, settings.output_topic])
    with contextlib.ExitStack() as airflow:
        stack = start_airflow(work, broker, connect, settings, False, airflow)
        stack.wait_for_dag(settings.dag_id)
        wait_watching(stack, settings.pipeline_id)
        consumer = VisibilityConsumer(broker.bootstrap_servers, settings.output_topic)
        consumer.start()
        consumer.ready.wait(60)
        try:
            warmup = SteadyProducer(broker.bootstrap_servers, settings.input_topic, args.warmup, 1)
            warmup.start()
            wait_visible(consumer, warmup, args.drain_timeout, stack._check_alive)
            wait_idle(stack, settings.dag_id)
            steps, produced = search("ours", broker.bootstrap_servers, settings.input_topic, consumer, args.rates,
                                     seconds, args.warmup, args.drain_timeout, args.growth_s, stack._check_alive,
                                     settle=lambda: wait_idle(stack, settings.dag_id))
            time.sleep(2)  # a duplicate would be committed by a run that has ended: read what it wrote
        finally:
            consumer.stop()
    exact = exactness(consumer, produced)
    print(f"ours over all steps: {exact}")
    return steps, exact.exact


def measure_spark(broker: LocalKafkaBroker, connect: LocalSparkConnectServer, args: argparse.Namespace,
                  seconds: float, checkpoint: Path) -> list[Step]:
    from pyspark.sql import SparkSession

    create_topics(broker.bootstrap_servers, ["spark_in", "spark_out"])
    spark = SparkSession.builder.remote(connect.url).getOrCreate()
    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap_servers)
             .option("subscribe", "spark_in").option("startingOffsets", "earliest").load()
             .select("key", "value")
             .writeStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap_servers)
             .option("topic", "spark_out").option("checkpointLocation", str(checkpoint)).queryName("rate").start())
    consumer = VisibilityConsumer(broker.bootstrap_servers, "spark_out")

    def alive() -> None:
        if not query.isActive:
            raise RuntimeError(f"Spark's streaming query stopped: {query.exception()}")

    try:
        consumer.start()
        consumer.ready.wait(60)
        warmup = SteadyProducer(broker.bootstrap_servers, "spark_in", args.warmup, 1)
        warmup.start()
        wait_visible(consumer, warmup, args.drain_timeout, alive)
        steps, _ = search("spark streaming", broker.bootstrap_servers, "spark_in", consumer, args.rates, seconds,
                          args.warmup, args.drain_timeout, args.growth_s, alive)
    finally:
        consumer.stop()
        query.stop()
        spark.stop()
    return steps


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", type=lambda text: [float(r) for r in text.split(",")],
                        default=[1000, 2000, 5000, 10000, 20000, 50000], help="records/s of the steps, ascending")
    parser.add_argument("--step-minutes", type=float, default=2, help="how long each step's producer runs")
    parser.add_argument("--growth-s", type=float, default=5, help="latency growth within a step that means a backlog")
    parser.add_argument("--warmup", type=int, default=100, help="records made visible before the first step")
    parser.add_argument("--no-spark", action="store_true", help="ours only")
    parser.add_argument("--drain-timeout", type=float, default=900, help="s for a step's last records to be visible")
    return parser.parse_args()


def main() -> int:
    args = arguments()
    seconds = args.step_minutes * 60
    work = Path(tempfile.mkdtemp(prefix="bench-freshness-rate-"))
    load_before = os.getloadavg()
    print(f"steps {', '.join(f'{r:g}' for r in args.rates)} records/s, {args.step_minutes:g} min each; Airflow's "
          f"default settings, the provider's defaults; work folder {work}", flush=True)
    with contextlib.ExitStack() as servers:
        broker = LocalKafkaBroker(work / "kafka").start()
        servers.callback(broker.stop)
        connect = LocalSparkConnectServer(work / "spark-connect").start()
        servers.callback(connect.stop)
        ours, exact = measure_ours(work, broker, connect, args, seconds)
        spark = [] if args.no_spark else measure_spark(broker, connect, args, seconds, work / "spark-checkpoint")
    load_after = os.getloadavg()
    print(f"\nload average {load_before[0]:.1f} before, {load_after[0]:.1f} after ({os.cpu_count()} cores)")
    for name, steps in (("ours", ours), ("spark streaming", spark)):
        for step in steps:
            print_step(name, step)
    line = f"sustainable: ours {best(ours):g} records/s"
    if spark:
        line += (f", Spark's streaming query {best(spark):g} records/s (ours / Spark's "
                 f"{best(ours) / max(best(spark), 1e-9):.2f}x; a contender sustaining the last step may go further)")
    print(line)
    print(json.dumps({"ours": [asdict(s) for s in ours], "spark": [asdict(s) for s in spark],
                      "load": [load_before, load_after], "step_minutes": args.step_minutes}, default=str))
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
