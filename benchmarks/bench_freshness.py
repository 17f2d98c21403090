"""Freshness: seconds from a record produced to its output visible (read_committed), under a steady load, against
Spark Structured Streaming's own Kafka -> Kafka query on the same machine (issue 51).

Starts a Kafka broker, a warm Spark Connect server, PostgreSQL (Airflow's metadata) and a real Airflow (api-server,
scheduler, dag-processor, triggerer, LocalExecutor) from devtools. Then, one after the other:

* ours: a producer thread writes --rate records/s for --minutes into a 6-partition topic (each record carries its
  id and its produce time); the DAG of benchmarks/dags/bench_freshness_dag.py (Kafka -> Kafka, EXACTLY_ONCE,
  scheduled on an Asset whose watcher is the backlog trigger, max_active_runs=1, the write on the Connect server)
  runs whenever records wait; a read_committed consumer notes when each id becomes visible in the output topic;
* Spark's: the same producer and consumer around Spark's own streaming query on fresh topics of the same layout
  (readStream kafka -> writeStream kafka, the default trigger: the next micro-batch as soon as the last ends,
  a checkpoint in a temporary folder), run on the same Connect server after Airflow stopped.

Prints for each: produced-to-visible p50 / p95 / p99 / max, the records/s sustained (output), and for ours the
batches, records per batch, where a run's seconds go (plan / write / notify_complete, and Airflow's gaps: a run
queued before it runs, a task queued before it runs, the hand-over between tasks, the wait between runs) from
Airflow's REST API, the resident memory (with children) of the scheduler, triggerer, Connect server and broker at
start and end, the ratios, and the load average. Ours must be exact (every produced id visible once): the
benchmark exits non-zero otherwise. Spark's query is at least once: its duplicates are printed, not failed.

The headline runs Airflow's scheduler and triggerer at Airflow's defaults and the trigger at the provider's
documented default poll (triggers.backlog.DEFAULT_POLL_SECONDS); --tuned names the shorter settings it uses.

    PYTHONPATH=. python benchmarks/bench_freshness.py --rate 1000 --minutes 10
    PYTHONPATH=. python benchmarks/bench_freshness.py --rate 50 --minutes 1 --no-spark      # a short look
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import signal
import subprocess
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from kafka.admin import KafkaAdminClient, NewTopic

import airflow_exactly_once
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.retention import AUTO_PRUNE_MIN
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.hooks.ledger import EMBEDDED_LEDGER_FILE
from airflow_exactly_once.triggers.backlog import DEFAULT_POLL_SECONDS
from benchmarks.freshness_faults import (COMPONENTS, AirflowComponent, Fault, FaultInjector, Restartable,
                                         ServerComponent, sigkill_session)
from benchmarks.freshness_plots import PlotLibraryMissing, draw, pyplot
from benchmarks.freshness_sampler import Sampler, memory_mb
from benchmarks.freshness_series import (GOAL_P99_SECONDS, RECOVERY_HOLD_SECONDS, RECOVERY_WINDOW_SECONDS,
                                         WINDOW_SECONDS, Comparison, Visibility, latency_windows, ledger_bound,
                                         memory_flatness, recovery_seconds, task_flatness)
from benchmarks.freshness_watcher import Watcher
from devtools.airflow_stack import METADATA_DATABASE, AirflowStack, metadata_server
from devtools.kafka_broker import LocalKafkaBroker
from devtools.maven import spark_conf_dir
from devtools.spark_connect import LocalSparkConnectServer

DAG_FILE = Path(__file__).resolve().parent / "dags" / "bench_freshness_dag.py"
SETTINGS_FILE = "bench_freshness.json"  # benchmarks/dags/bench_freshness_dag.py reads it from its DAG folder
PARTITIONS = 6
SPARK_CONN_ID = "bench_spark_connect"
TASKS = ("plan", "write", "notify_complete")
# The test stack's shorter heartbeats (devtools/airflow_stack.py): dropped for the headline, so that the scheduler
# and the triggerer run at Airflow's own defaults.
STACK_TUNINGS = ("AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC", "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_SEC",
                 "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT")
# --tuned: each setting, its value and its effect (Airflow's default in brackets).
TUNED_AIRFLOW = {
    "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": ("0.2", "the scheduler's sleep when a loop found nothing [1 s]"),
    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": ("1", "the scheduler's heartbeat [5 s]"),
}
TUNED_POLL_SECONDS = 1.0  # the backlog trigger's poll_interval_seconds [the provider's default: DEFAULT_POLL_SECONDS]
# The broker's heap as Kafka's own kafka-server-start.sh sizes it (-Xms = -Xmx = 1G), touched when the JVM starts: its
# resident memory is then the heap it will use from the first minute, so the hour's memory check sees what the broker
# holds, not the JVM deciding once to grow its heap (the dev broker's -Xms256m -Xmx768m did, at minute 36 of an hour).
BROKER_HEAP = ("-Xms1g", "-Xmx1g", "-XX:+AlwaysPreTouch")

# What the visibility consumer is told while the broker is down (the faults' run): the client reconnects by itself.
BROKER_AWAY = (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT)


# -- records: an id and the moment it was produced ------------------------------------------------------------


def record_value(record_id: int, produced_ms: int) -> bytes:
    return b'{"id":%d,"ts":%d}' % (record_id, produced_ms)


def parse_value(value: bytes) -> tuple[int, int]:
    """(id, produced epoch ms) of a record_value, as it reaches the output topic unchanged."""
    record = json.loads(value)
    return record["id"], record["ts"]


def create_topics(bootstrap: str, names: list[str], partitions: int = PARTITIONS) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1) for name in names])
    finally:
        admin.close()


class SteadyProducer(threading.Thread):
    """Produces `rate` records/s for `seconds`, ids first_id, first_id + 1, ... round-robin over the partitions,
    each stamped with its produce time (epoch ms) in its value; `produced` counts them. Sends what is due every
    few milliseconds, so the rate holds over any second however the thread is scheduled."""

    def __init__(self, bootstrap: str, topic: str, rate: float, seconds: float, first_id: int = 0,
                 partitions: int = PARTITIONS) -> None:
        super().__init__(name=f"producer-{topic}", daemon=True)
        self.bootstrap, self.topic, self.rate, self.seconds = bootstrap, topic, rate, seconds
        self.first_id, self.partitions = first_id, partitions
        self.produced = 0
        self.started_at = self.ended_at = 0.0
        self.error: BaseException | None = None

    @property
    def due(self) -> int:
        return int(self.rate * self.seconds)

    def run(self) -> None:
        try:
            producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": 5,
                                 "enable.idempotence": True})
            self.started_at = time.time()
            while self.produced < self.due:
                now = time.time()
                target = min(self.due, int((now - self.started_at) * self.rate) + 1)
                stamp = int(now * 1000)
                while self.produced < target:
                    record_id = self.first_id + self.produced
                    try:
                        producer.produce(self.topic, key=str(record_id).encode(), value=record_value(record_id, stamp),
                                         partition=record_id % self.partitions, on_delivery=self._delivered)
                    except BufferError:  # the client's queue is full: let it send, then this record again
                        producer.poll(0.05)
                        continue
                    self.produced += 1
                producer.poll(0)
                time.sleep(0.005)
            if producer.flush(60):
                raise RuntimeError(f"the producer could not deliver every record to {self.topic} in 60 s")
            self.ended_at = time.time()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller's wait
            self.error = exc

    def _delivered(self, error: Any, _message: Any) -> None:
        """A record the broker never took would read as one the pipeline lost: the run fails instead."""
        if error is not None and self.error is None:
            self.error = KafkaException(error)


class VisibilityConsumer(threading.Thread):
    """Reads the output topic with isolation.level=read_committed from its start and notes, per id, how often it
    appeared and the produced-to-visible latency of its first appearance (ms; a record is visible when this
    consumer receives it)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(name=f"consumer-{topic}", daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.counts = bytearray()  # per id, capped at 255
        self.latency_ms: dict[int, int] = {}
        self.produced_ms: dict[int, int] = {}
        self.distinct = self.received = 0
        self.last_visible = 0.0
        self.broker_away = 0  # transient errors while the broker was unreachable
        self.error: BaseException | None = None
        self._stop_asked = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"freshness-{uuid.uuid4().hex}",
                                 "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                                 "enable.auto.commit": False, "fetch.wait.max.ms": 50})
            consumer.subscribe([self.topic], on_assign=lambda *_: self.ready.set())
            try:
                while not self._stop_asked.is_set():
                    messages = consumer.consume(1000, 0.2)
                    seen = time.time()
                    for message in messages:
                        error = message.error()
                        if error is not None:
                            if error.code() in BROKER_AWAY or error.retriable():
                                self.broker_away += 1
                                continue
                            raise KafkaException(error)
                        self._note(*parse_value(message.value() or b""), seen)
            finally:
                consumer.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller's wait
            self.error = exc
            self.ready.set()

    def _note(self, record_id: int, produced_ms: int, seen: float) -> None:
        if record_id >= len(self.counts):
            self.counts.extend(bytes(record_id + 1 - len(self.counts) + 100_000))
        self.received += 1
        if self.counts[record_id] == 0:
            self.distinct += 1
            self.latency_ms[record_id] = int(seen * 1000) - produced_ms
            self.produced_ms[record_id] = produced_ms
            self.last_visible = seen
        if self.counts[record_id] < 255:
            self.counts[record_id] += 1

    def stop(self) -> None:
        self._stop_asked.set()
        self.join(30)

    def visibility(self, first_id: int, last_id: int, since: float) -> Visibility:
        """When each id of first_id..last_id - 1 became visible and its latency, in seconds from `since` (epoch s)."""
        return Visibility.of([((self.produced_ms[i] + self.latency_ms[i]) / 1000 - since, self.latency_ms[i] / 1000)
                              for i in range(first_id, last_id) if i in self.latency_ms])


def check_threads(*threads: SteadyProducer | VisibilityConsumer) -> None:
    for thread in threads:
        if thread.error is not None:
            raise RuntimeError(f"{thread.name} failed: {thread.error!r}") from thread.error


def wait_visible(consumer: VisibilityConsumer, producer: SteadyProducer, timeout: float,
                 alive: Callable[[], None] = lambda: None) -> None:
    """Until every record the producer was due to send is visible, checking both threads (and `alive`: the
    servers) every second; TimeoutError says how many are missing."""
    deadline = time.monotonic() + timeout
    while producer.is_alive() or consumer.distinct < producer.first_id + producer.produced:
        check_threads(producer, consumer)
        alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{producer.first_id + producer.produced - consumer.distinct} of "
                               f"{producer.first_id + producer.produced} records not visible in {consumer.topic} "
                               f"within {timeout:.0f} s")
        time.sleep(0.5)
    check_threads(producer, consumer)


# -- figures --------------------------------------------------------------------------------------------------


@dataclass
class Exactness:
    produced: int
    missing: int
    duplicated: int  # ids seen more than once
    unexpected: int  # ids never produced

    @property
    def exact(self) -> bool:
        return self.missing == self.duplicated == self.unexpected == 0


def exactness(consumer: VisibilityConsumer, produced: int) -> Exactness:
    counts = consumer.counts
    seen = counts[:produced]
    return Exactness(produced, missing=produced - len(seen) + seen.count(0),
                     duplicated=sum(1 for c in seen if c > 1), unexpected=sum(1 for c in counts[produced:] if c))


def percentile(ordered: list[int], share: float) -> int:
    """The nearest-rank percentile of sorted values."""
    return ordered[min(len(ordered) - 1, max(0, int(round(share * len(ordered))) - 1))]


def latency_summary(latency_ms: list[int]) -> dict[str, float]:
    ordered = sorted(latency_ms)
    if not ordered:
        return {}
    return {name: percentile(ordered, share) / 1000 for name, share in
            (("p50", 0.50), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))}


@dataclass
class StreamResult:
    """What the producer and the visibility consumer saw of one contender (latency over measured ids only)."""

    name: str
    latency_s: dict[str, float]
    records: int
    output_records_per_s: float  # records / (the last one visible - the first one produced)
    # the slope of visibility between the ids at 10 % and 90 % of the run: the rate it keeps up with (R when it
    # keeps up, less when a backlog grows), free of the first batch's wait and of the last one's
    sustained_records_per_s: float
    exactness: Exactness
    by_minute: list[dict[str, float]] = field(default_factory=list)  # p50 / p99 per minute produced: a backlog grows


def stream_result(name: str, consumer: VisibilityConsumer, producer: SteadyProducer) -> StreamResult:
    measured = range(producer.first_id, producer.first_id + producer.produced)
    latencies = [consumer.latency_ms[i] for i in measured if i in consumer.latency_ms]
    first_produced = consumer.produced_ms.get(producer.first_id, producer.started_at * 1000) / 1000
    span = max(consumer.last_visible - first_produced, 1e-9)
    low, high = measured[len(measured) // 10], measured[max(0, len(measured) * 9 // 10 - 1)]

    def visible_at(i: int) -> float:
        return (consumer.produced_ms[i] + consumer.latency_ms[i]) / 1000

    sustained = ((high - low) / max(visible_at(high) - visible_at(low), 1e-3)
                 if high > low and {low, high} <= consumer.latency_ms.keys() else 0.0)
    started_ms = int(producer.started_at * 1000)
    minutes: dict[int, list[int]] = {}
    for i in measured:
        if i in consumer.latency_ms:
            minutes.setdefault(max(0, consumer.produced_ms[i] - started_ms) // 60_000, []).append(
                consumer.latency_ms[i])
    by_minute = [{"minute": m, **{k: v for k, v in latency_summary(v).items() if k in ("p50", "p99")}}
                 for m, v in sorted(minutes.items())]
    return StreamResult(name, latency_summary(latencies), len(latencies), len(latencies) / span, sustained,
                        exactness(consumer, producer.first_id + producer.produced), by_minute)


def moment(text: str) -> float:
    """Epoch seconds of a REST API timestamp."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def paged(stack: AirflowStack, path: str, key: str) -> list[dict[str, Any]]:
    """Every item of a paged REST list (100 a page)."""
    items: list[dict[str, Any]] = []
    while True:
        page = stack.api("GET", f"{path}{'&' if '?' in path else '?'}limit=100&offset={len(items)}")[key]
        items += page
        if len(page) < 100:
            return items


GAPS = ("run queued", "run start -> plan queued", "task queued -> running", "between tasks",
        "last task -> run end", "between runs")


def finished_runs(stack: AirflowStack, dag_id: str, since: float = 0.0
                  ) -> tuple[list[dict[str, Any]], dict[str, dict[str, dict[str, Any]]]]:
    """The DAG's finished runs queued after `since` (epoch s), oldest first, and each run's task instances by the
    last part of their task id (REST API)."""
    runs = sorted((r for r in paged(stack, f"/dags/{dag_id}/dagRuns?order_by=run_after", "dag_runs")
                   if r["state"] in ("success", "failed") and moment(r["queued_at"]) >= since),
                  key=lambda r: r["queued_at"])
    tis: dict[str, dict[str, dict[str, Any]]] = {}
    for ti in paged(stack, f"/dags/{dag_id}/dagRuns/~/taskInstances", "task_instances"):
        tis.setdefault(ti["dag_run_id"], {})[ti["task_id"].rpartition(".")[2]] = ti
    return runs, tis


def run_timeline(runs: list[dict[str, Any]], tis: dict[str, dict[str, dict[str, Any]]],
                 since: float) -> list[dict[str, Any]]:
    """Per run: its start (s from `since`), its state, each task's duration (s; None if it did not end) and tries."""
    timeline = []
    for run in runs:
        if not run.get("start_date"):
            continue
        mine = tis.get(run["dag_run_id"], {})
        point: dict[str, Any] = {"start": round(moment(run["start_date"]) - since, 2), "state": run["state"]}
        for name in TASKS:
            ti = mine.get(name, {})
            point[name] = (round(moment(ti["end_date"]) - moment(ti["start_date"]), 3)
                           if ti.get("start_date") and ti.get("end_date") else None)
            point[f"{name}_tries"] = ti.get("try_number", 0)
            point[f"{name}_state"] = ti.get("state")
        timeline.append(point)
    return timeline


def run_breakdown(stack: AirflowStack, dag_id: str, since: float = 0.0) -> dict[str, Any]:
    """Where the seconds of the DAG's finished runs go, from Airflow's DAG runs and task instances (REST API):
    each task's start to end, and Airflow's gaps: a run queued before it starts, its start until plan is queued, a
    task queued before it runs, a task's end until the next is queued, the last task's end until the run ends,
    and a run's end until the next run is queued (the trigger's poll, its event, the run's creation). Totals in
    seconds; shares of all runs' cycles (a cycle: the previous run's end to this one's). Only the runs queued
    after `since` (epoch s), the first one's cycle starting then (the first record produced)."""
    return breakdown_of(*finished_runs(stack, dag_id, since), since)


def breakdown_of(runs: list[dict[str, Any]], tis: dict[str, dict[str, dict[str, Any]]],
                 since: float) -> dict[str, Any]:
    """run_breakdown of runs and task instances already fetched (finished_runs)."""
    totals = dict.fromkeys((*TASKS, *GAPS), 0.0)
    cycles = 0.0
    previous_end: float | None = since or None
    for run in runs:
        mine = tis.get(run["dag_run_id"], {})
        if not all(name in mine and mine[name]["end_date"] for name in TASKS):
            previous_end = moment(run["end_date"])
            continue
        queued, start, end = moment(run["queued_at"]), moment(run["start_date"]), moment(run["end_date"])
        parts = {name: moment(mine[name]["end_date"]) - moment(mine[name]["start_date"]) for name in TASKS}
        parts["run queued"] = start - queued
        parts["run start -> plan queued"] = moment(mine["plan"]["queued_when"]) - start
        parts["task queued -> running"] = sum(moment(mine[n]["start_date"]) - moment(mine[n]["queued_when"])
                                              for n in TASKS)
        parts["between tasks"] = sum(moment(mine[b]["queued_when"]) - moment(mine[a]["end_date"])
                                     for a, b in zip(TASKS, TASKS[1:]))
        parts["last task -> run end"] = end - moment(mine["notify_complete"]["end_date"])
        parts["between runs"] = queued - previous_end if previous_end is not None else 0.0
        cycles += sum(parts.values())
        for name, seconds in parts.items():
            totals[name] += seconds
        previous_end = end
    return {"runs": len(runs), "failed": sum(r["state"] == "failed" for r in runs), "cycle_seconds": cycles,
            "seconds": totals, "share": {k: (v / cycles if cycles else 0.0) for k, v in totals.items()}}


def batch_sizes(ledger_url: str, pipeline_id: str) -> list[int]:
    """Output records of each committed batch of the pipeline, oldest first."""
    ledger = Ledger.read_only(ledger_url)
    try:
        return [b.output_records or 0 for b in ledger.list_batches(pipeline_id, [BatchState.COMMITTED],
                                                                    newest_first=False)]
    finally:
        ledger.engine.dispose()


# -- ours: the DAG in a real Airflow ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DagSettings:
    """What benchmarks/dags/bench_freshness_dag.py builds its DAG from (SETTINGS_FILE in the DAG folder)."""

    dag_id: str
    pipeline_id: str
    input_topic: str
    output_topic: str
    spark_conn_id: str | None
    poll_interval_seconds: float | None  # None: the provider's default
    retention_batches: int | None = None  # None: the provider's default retention (by count and by age)


def install_dag(dags_folder: Path, settings: DagSettings) -> None:
    """Write the DAG's settings into an Airflow's DAG folder and link the DAG file there (before or after the
    stack started: its dag-processor finds new files every few seconds)."""
    dags_folder.mkdir(parents=True, exist_ok=True)
    (dags_folder / SETTINGS_FILE).write_text(json.dumps(asdict(settings)))
    link = dags_folder / DAG_FILE.name
    if not link.exists():
        link.symlink_to(DAG_FILE)


def wait_watching(stack: AirflowStack, pipeline_id: str, timeout: float = 300.0) -> None:
    """Until the triggerer runs the DAG's backlog trigger (its first log line)."""
    deadline = time.monotonic() + timeout
    while f"watching pipeline {pipeline_id} " not in stack.log_text("triggerer"):
        stack._check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"the triggerer did not start the backlog trigger of {pipeline_id} in {timeout:.0f} s; "
                               f"see {stack.home}/triggerer.log")
        time.sleep(1)


def wait_idle(stack: AirflowStack, dag_id: str, timeout: float = 600.0) -> None:
    """Until no run of the DAG is queued or running."""
    deadline = time.monotonic() + timeout
    while any(r["state"] not in ("success", "failed")
              for r in paged(stack, f"/dags/{dag_id}/dagRuns?state=queued&state=running", "dag_runs")):
        stack._check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"runs of {dag_id} still queued or running after {timeout:.0f} s")
        time.sleep(1)


@dataclass
class OursResult:
    stream: StreamResult
    breakdown: dict[str, Any]
    batch_records: list[int]
    memory_start: dict[str, float]
    memory_end: dict[str, float]
    started_at: float = 0.0  # epoch s: the measured producer's start, time 0 of the series
    # per record visible: when (s from started_at) and its latency; per run: its start and its tasks' durations
    visibility: Visibility = field(default_factory=lambda: Visibility([], []), repr=False)
    timeline: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, Any]:
        """What the final JSON line carries (not the per-record and per-run series: --series writes those)."""
        return {"stream": asdict(self.stream), "breakdown": self.breakdown, "batch_records": self.batch_records,
                "memory_start": self.memory_start, "memory_end": self.memory_end}


Pids = Callable[[], dict[str, "int | None"]]


def measure_ours(stack: AirflowStack, bootstrap: str, settings: DagSettings, rate: float, seconds: float,
                 warmup_records: int = 0, pids: dict[str, int] | Pids | None = None,
                 drain_timeout: float = 600.0, watchers: Sequence[Watcher] = ()) -> OursResult:
    """One run of our pipeline under a steady load, the DAG already installed (install_dag) and the topics created:
    `warmup_records` first (visible before the clock starts: the Connect server's first job, the first run), then
    `rate` records/s for `seconds`; returns when every produced record is visible and no run is left. `pids`: the
    processes whose memory is noted at start and end (a callable when a fault restarts them); `watchers` run
    during the measured phase."""
    current_pids: Pids = pids if callable(pids) else (lambda: dict(pids or {}))

    def alive() -> None:
        stack._check_alive()
        for watcher in watchers:
            watcher.check()

    stack.wait_for_dag(settings.dag_id)
    wait_watching(stack, settings.pipeline_id)
    consumer = VisibilityConsumer(bootstrap, settings.output_topic)
    consumer.start()
    consumer.ready.wait(60)
    if warmup_records:
        warmup = SteadyProducer(bootstrap, settings.input_topic, warmup_records, 1)
        warmup.start()
        wait_visible(consumer, warmup, drain_timeout, stack._check_alive)
        wait_idle(stack, settings.dag_id)
    memory_start = memory_mb(current_pids())
    ledger_url = f"sqlite:///{stack.home / EMBEDDED_LEDGER_FILE}"
    warmup_batches = len(batch_sizes(ledger_url, settings.pipeline_id)) if warmup_records else 0
    producer = SteadyProducer(bootstrap, settings.input_topic, rate, seconds, first_id=warmup_records)
    producer.start()
    try:
        while not producer.started_at and producer.is_alive():
            time.sleep(0.01)
        for watcher in watchers:
            watcher.begin(producer.started_at)
        wait_visible(consumer, producer, seconds + drain_timeout, alive)
        memory_end = memory_mb(current_pids())
        wait_idle(stack, settings.dag_id)
        time.sleep(2)  # a duplicate would be committed by a run that has ended: read what it wrote
    finally:
        for watcher in watchers:
            watcher.stop()
        consumer.stop()
    alive()
    runs, tis = finished_runs(stack, settings.dag_id, producer.started_at)
    return OursResult(stream_result("ours", consumer, producer), breakdown_of(runs, tis, producer.started_at),
                      batch_sizes(ledger_url, settings.pipeline_id)[warmup_batches:], memory_start, memory_end,
                      producer.started_at,
                      consumer.visibility(producer.first_id, producer.first_id + producer.produced,
                                          producer.started_at),
                      run_timeline(runs, tis, producer.started_at))


class DefaultsAirflowStack(AirflowStack):
    """The devtools stack without the test stack's shorter scheduler heartbeats: Airflow's own defaults (plus
    `tuned`, when given). One component can be SIGKILLed and started again while the rest runs (the faults)."""

    # What a component's log says once it serves again after a restart.
    STARTED = {"scheduler": "Starting the scheduler", "triggerer": "Starting the triggerer",
               "dag-processor": "Starting the Dag Processor Job"}

    def __init__(self, *args: Any, tuned: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tuned = tuned or {}
        self._components_lock = threading.Lock()  # the faults' thread changes `processes` while others check them
        self._orphans: list[subprocess.Popen] = []  # a killed scheduler's session: its workers may still run

    def stop(self) -> None:
        super().stop()
        for process in self._orphans:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)

    def _check_alive(self) -> None:
        with self._components_lock:
            super()._check_alive()

    def kill_component(self, name: str) -> None:
        """SIGKILL one component. The scheduler alone, as `kill -9` or the OOM killer would: the LocalExecutor's
        workers it started finish the task they run (it reports to the api-server) and exit. Killed with them, as a
        lost machine would, the task instance stays `running` until the restarted scheduler's orphan check
        (`[scheduler] orphaned_tasks_check_interval`, 300 s by default) resets it. Other components with their
        session."""
        with self._components_lock:
            process = self.processes.pop(name)
        if name != "scheduler":
            sigkill_session(process)
            return
        process.kill()
        process.wait()
        self._orphans.append(process)  # its workers' session, stopped with the stack

    def restart_component(self, name: str, timeout: float = 180.0) -> None:
        """Start a killed component again, as the stack started it; returns once its log says it started."""
        log_size = len(self.log_text(name))
        with self._components_lock:
            self._spawn(name, [self._airflow(), name], {**self.env(), **self.component_env.get(name, {})})
        deadline = time.monotonic() + timeout
        while self.STARTED[name] not in self.log_text(name)[log_size:]:
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"airflow {name} did not start again within {timeout:.0f} s; see "
                                   f"{self.home}/{name}.log")
            time.sleep(0.5)

    def env(self) -> dict[str, str]:
        env = super().env()
        for key in STACK_TUNINGS:
            if key not in self.extra_env:
                env.pop(key, None)
        env.update(self.tuned)
        return env


def start_airflow(work: Path, broker: LocalKafkaBroker, connect: LocalSparkConnectServer, settings: DagSettings,
                  tuned: bool, servers: contextlib.ExitStack) -> DefaultsAirflowStack:
    """PostgreSQL for the metadata, then Airflow with the benchmark's DAG installed; both stop with `servers`."""
    database = metadata_server(work / "airflow-metadata")
    servers.callback(database.stop)
    env = {
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka",
                                                  "extra": {"bootstrap.servers": broker.bootstrap_servers}}),
        f"AIRFLOW_CONN_{SPARK_CONN_ID.upper()}": json.dumps(connect.connection()),
        "SPARK_CONF_DIR": str(spark_conf_dir(work / "spark-conf")),
    }
    stack = DefaultsAirflowStack(work / "airflow", [], env, triggerer=True,
                                 database_url=database.url(METADATA_DATABASE),
                                 tuned={k: v for k, (v, _) in TUNED_AIRFLOW.items()} if tuned else None)
    install_dag(stack.dags_folder, settings)
    compile_for_tasks(stack.dags_folder)
    servers.callback(stack.stop)
    stack.start()
    return stack


def compile_for_tasks(dags_folder: Path) -> None:
    """Bytecode for the package and the DAG folder's files, as a pip install leaves it: this machine sets
    PYTHONDONTWRITEBYTECODE, so without it every Airflow task (and every Spark worker importing the shipped package)
    would compile them again, which a user never pays."""
    for folder in (Path(airflow_exactly_once.__file__).parent, dags_folder):
        if not compileall.compile_dir(folder, quiet=1):
            raise RuntimeError(f"compiling {folder} failed (see the errors above): fix the file it names")


# -- Spark's: Structured Streaming on the same Connect server --------------------------------------------------


def measure_spark_streaming(connect_url: str, bootstrap: str, input_topic: str, output_topic: str, rate: float,
                            seconds: float, checkpoint: Path, warmup_records: int = 0,
                            drain_timeout: float = 600.0) -> StreamResult:
    """Spark's own Kafka -> Kafka streaming query (the default trigger: as soon as possible) under the same load
    and visibility consumer, the topics already created."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(connect_url).getOrCreate()
    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", input_topic).option("startingOffsets", "earliest").load()
             .select("key", "value")
             .writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", output_topic)
             .option("checkpointLocation", str(checkpoint)).queryName("freshness").start())
    consumer = VisibilityConsumer(bootstrap, output_topic)
    try:
        consumer.start()
        consumer.ready.wait(60)

        def alive() -> None:
            if not query.isActive:
                raise RuntimeError(f"Spark's streaming query stopped: {query.exception()}")

        if warmup_records:
            warmup = SteadyProducer(bootstrap, input_topic, warmup_records, 1)
            warmup.start()
            wait_visible(consumer, warmup, drain_timeout, alive)
        producer = SteadyProducer(bootstrap, input_topic, rate, seconds, first_id=warmup_records)
        producer.start()
        wait_visible(consumer, producer, seconds + drain_timeout, alive)
        time.sleep(2)
    finally:
        consumer.stop()
        query.stop()
        spark.stop()
    return stream_result("spark streaming", consumer, producer)


# -- the series and the checks of the hour run and the faults' run -----------------------------------------------


def build_series(ours: OursResult, samples: list[dict[str, Any]], faults: list[Fault], args: argparse.Namespace
                 ) -> dict[str, Any]:
    """What --series writes and --plot draws: latency per window, the sampled memory and ledger size, each run's
    tasks and the faults, times in seconds from the measured producer's start."""
    visible = ours.visibility.visible_s
    end = max(visible[-1] if visible else 0.0, args.minutes * 60)
    return {"rate": args.rate, "minutes": args.minutes, "started_at": ours.started_at, "goal_s": GOAL_P99_SECONDS,
            "window_s": WINDOW_SECONDS, "retention_batches": args.retention_batches,
            "latency": latency_windows(ours.visibility, end), "samples": samples, "runs": ours.timeline,
            "faults": [{**asdict(f), "down_s": f.down_s} for f in faults]}


def note_recoveries(faults: list[Fault], visibility: Visibility) -> None:
    """Each fault's recovery time (freshness_series.recovery_seconds) up to the last record visible."""
    until = visibility.visible_s[-1] if visibility.visible_s else 0.0
    for fault in faults:
        if fault.returned is not None:
            fault.recovery_s = recovery_seconds(visibility, fault.returned, until)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def failed_tasks(timeline: list[dict[str, Any]]) -> tuple[int, int]:
    """Task instances that ended failed (or upstream_failed), and those that needed more than one try."""
    failed = sum(1 for run in timeline for name in TASKS if run[f"{name}_state"] in ("failed", "upstream_failed"))
    retried = sum(1 for run in timeline for name in TASKS if run[f"{name}_tries"] > 1)
    return failed, retried


def comparison_check(name: str, comparison: Comparison | None) -> Check:
    if comparison is None:
        return Check(name, False, "no data in one of the windows compared: run longer")
    return Check(name, comparison.flat, comparison.describe())


def drift_checks(ours: OursResult, samples: list[dict[str, Any]], seconds: float, retention_batches: int | None,
                 restarted: set[str]) -> list[Check]:
    """The hour run's checks: no failed or retried task instance, plan and notify_complete flat, the memory of each
    long-lived process flat (not of one a fault restarted), the ledger bounded by retention."""
    failed, retried = failed_tasks(ours.timeline)
    checks = [Check("no failed task instance", failed == 0 and retried == 0,
                    f"{failed} failed, {retried} retried of {len(ours.timeline)} runs' tasks")]
    for task in ("plan", "notify_complete"):
        durations = [(run["start"], run[task]) for run in ours.timeline if run[task] is not None]
        checks.append(comparison_check(f"{task} flat", task_flatness(task, durations, seconds)))
    for process in sorted({name for sample in samples for name in sample["memory_mb"]} - restarted):
        points = [(sample["t"], sample["memory_mb"][process]) for sample in samples]
        checks.append(comparison_check(f"{process} memory flat", memory_flatness(process, points, seconds)))
    if retention_batches is not None:
        bound = ledger_bound(retention_batches, AUTO_PRUNE_MIN)
        counts = [sample["ledger_batches"] for sample in samples if sample["ledger_batches"] is not None]
        last, most = (counts[-1], max(counts)) if counts else (None, None)
        checks.append(Check("ledger bounded", last is not None and most is not None and most <= bound,
                            f"batches at the end {last}, at most {most}; bound {bound} (retention "
                            f"{retention_batches} + {AUTO_PRUNE_MIN} before notify_complete prunes + the floor + "
                            f"2 in flight)"))
    return checks


def fault_checks(faults: list[Fault], until: float) -> list[Check]:
    """Each fault: the component came back, and freshness was back under the goal within 60 s of its return (issue
    51). A recovery the run ended too soon to confirm (less than 60 s + the hold left) is reported, not failed."""
    checks = []
    for fault in faults:
        name = f"{fault.component} fault recovered"
        if fault.returned is None or fault.killed is None:
            checks.append(Check(name, False, f"not killed and back during the run (planned at {fault.at:.0f} s)"))
        elif fault.recovery_s is None:
            left = until - fault.returned
            confirmable = left >= 60 + RECOVERY_HOLD_SECONDS
            checks.append(Check(name, not confirmable,
                                f"down {fault.down_s:.1f} s; p99 over {RECOVERY_WINDOW_SECONDS:g} s not back under "
                                f"{GOAL_P99_SECONDS:g} s for {RECOVERY_HOLD_SECONDS:g} s "
                                + ("within the run" if confirmable else
                                   f"before the run ended ({left:.0f} s after the return: unconfirmed, run longer)")))
        else:
            checks.append(Check(name, fault.recovery_s <= 60,
                                f"down {fault.down_s:.1f} s, recovery {fault.recovery_s:.0f} s (goal: within 60 s)"))
    return checks


def print_heaps(samples: list[dict[str, Any]], seconds: float) -> None:
    """The Java heap in use of each JVM at rest, the memory check's windows: what explains a resident memory that
    moved (reported, not judged: G1 keeps garbage in old regions until a mixed collection, so the heap in use may
    move more than 10 % without a leak)."""
    names = sorted({name for sample in samples for name in sample.get("heap_mb", {})})
    for name in names:
        points = [(sample["t"], sample["heap_mb"][name]) for sample in samples if name in sample.get("heap_mb", {})]
        comparison = memory_flatness(name, points, seconds)
        if comparison is not None:
            print(f"  {name}: Java heap in use at rest {comparison.first:.0f} -> {comparison.last:.0f} MB "
                  f"({comparison.ratio:.2f}x; reported, not judged)")


def seconds_or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def print_checks(checks: list[Check]) -> bool:
    """Prints each check; True when all passed."""
    for check in checks:
        print(f"  {'ok  ' if check.ok else 'FAIL'} {check.name}: {check.detail}")
    return all(check.ok for check in checks)


# -- the report --------------------------------------------------------------------------------------------------


def print_stream(result: StreamResult) -> None:
    lat = result.latency_s
    print(f"{result.name:<16} p50 {lat.get('p50', 0):7.2f} s  p95 {lat.get('p95', 0):7.2f} s  "
          f"p99 {lat.get('p99', 0):7.2f} s  max {lat.get('max', 0):7.2f} s  output records/s: sustained "
          f"{result.sustained_records_per_s:.0f}, overall {result.output_records_per_s:.0f}  ({result.records} "
          f"records; missing {result.exactness.missing}, duplicated "
          f"{result.exactness.duplicated}, unexpected {result.exactness.unexpected})")
    print("  by minute produced (p50 / p99 s): " + ", ".join(
        f"{m['minute']}: {m.get('p50', 0):.1f}/{m.get('p99', 0):.1f}" for m in result.by_minute))


def print_ours(ours: OursResult) -> None:
    print_stream(ours.stream)
    sizes = ours.batch_records
    print(f"  batches {len(sizes)} (runs {ours.breakdown['runs']}, failed {ours.breakdown['failed']}); records per "
          f"batch: median {statistics.median(sizes) if sizes else 0:.0f}, max {max(sizes, default=0)}")
    runs = max(ours.breakdown["runs"], 1)
    print("  where a run's seconds go (total s, per run s, share of all cycles):")
    for name, seconds in ours.breakdown["seconds"].items():
        print(f"    {name:<26} {seconds:9.1f} {seconds / runs:8.2f} {ours.breakdown['share'][name]:7.1%}")
    print("  resident memory with children, MB (start -> end): " + ", ".join(
        f"{name} {ours.memory_start.get(name, 0):.0f} -> {mb:.0f}" for name, mb in ours.memory_end.items()))


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1000, help="records/s produced")
    parser.add_argument("--minutes", type=float, default=10, help="how long the producer runs, each contender")
    parser.add_argument("--warmup", type=int, default=100, help="records made visible before the clock starts")
    parser.add_argument("--tuned", action="store_true", help="shorter scheduler loop and trigger poll (printed)")
    parser.add_argument("--no-spark", action="store_true", help="ours only")
    parser.add_argument("--drain-timeout", type=float, default=600, help="s for the last records to become visible")
    parser.add_argument("--name", default="freshness", help="names the series and figure files: NAME-series.json, "
                                                             "NAME-latency.png, NAME-memory.png")
    parser.add_argument("--series", type=Path, help="where the time series JSON goes [NAME-series.json in the "
                                                    "--plot folder, else in the run's work folder]")
    parser.add_argument("--plot", type=Path, metavar="DIR", help="draw the series into DIR (needs matplotlib: "
                                                                 "pip install airflow-exactly-once[benchmarks])")
    parser.add_argument("--retention-batches", type=int, help="the pipeline's retention_batches (by count alone)")
    parser.add_argument("--drift-checks", action="store_true",
                        help="fail unless no task failed, plan / notify_complete and memory stayed flat and the "
                             "ledger bounded (the hour run)")
    parser.add_argument("--faults", type=fault_names, default=[],
                        help=f"SIGKILL and restart each of these once, evenly spaced: any of {','.join(COMPONENTS)}")
    args = parser.parse_args()
    if args.plot is not None:
        try:
            pyplot()  # before the run, not after an hour of it
        except PlotLibraryMissing as exc:
            parser.error(str(exc))
    return args


def fault_names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(COMPONENTS))
    if unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"--faults takes each of {','.join(COMPONENTS)} at most once, comma "
                                         f"separated; got {text!r}")
    return names


def main() -> int:
    args = arguments()
    seconds = args.minutes * 60
    work = Path(tempfile.mkdtemp(prefix="bench-freshness-"))
    load_before = os.getloadavg()
    poll = TUNED_POLL_SECONDS if args.tuned else None
    settings = DagSettings("bench_freshness", "bench_freshness", "fresh_in", "fresh_out", SPARK_CONN_ID, poll)
    print(f"rate {args.rate:g} records/s for {args.minutes:g} min, {PARTITIONS} partitions; work folder {work}")
    if args.tuned:
        print(f"tuned: the backlog trigger's poll_interval_seconds {TUNED_POLL_SECONDS:g} [provider default "
              f"{DEFAULT_POLL_SECONDS:g}]; " +
              "; ".join(f"{k} = {v} ({what})" for k, (v, what) in TUNED_AIRFLOW.items()))
    else:
        print("Airflow's default scheduler and triggerer settings; the backlog trigger at the provider's defaults "
              f"(poll {DEFAULT_POLL_SECONDS:g} s, min_records 1)")
    if args.retention_batches is not None:
        settings = replace(settings, retention_batches=args.retention_batches)
    spark = None
    faults: list[Fault] = []
    samples: list[dict[str, Any]] = []
    with contextlib.ExitStack() as servers:
        broker = LocalKafkaBroker(work / "kafka", heap_options=BROKER_HEAP).start()
        servers.callback(broker.stop)
        connect = LocalSparkConnectServer(work / "spark-connect").start()
        servers.callback(connect.stop)
        create_topics(broker.bootstrap_servers, [settings.input_topic, settings.output_topic])
        with contextlib.ExitStack() as airflow:  # stopped before Spark's turn
            stack = start_airflow(work, broker, connect, settings, args.tuned, airflow)

            def pids() -> dict[str, int | None]:
                """The long-lived processes as they are now (a fault restarts one under a new pid)."""
                processes = {name: stack.processes.get(name) for name in ("scheduler", "triggerer", "dag-processor")}
                return {**{name: p.pid if p else None for name, p in processes.items()},
                        "connect server": connect.process.pid if connect.process else None,
                        "broker": broker.process.pid if broker.process else None}

            sampler = Sampler(pids, f"sqlite:///{stack.home / EMBEDDED_LEDGER_FILE}", settings.pipeline_id)
            components: dict[str, Restartable] = {"connect": ServerComponent("connect", connect),
                                                  "broker": ServerComponent("broker", broker),
                                                  "scheduler": AirflowComponent("scheduler", stack)}
            injector = FaultInjector([components[name] for name in args.faults], seconds)
            watchers: list[Watcher] = [sampler, *([injector] if args.faults else [])]
            try:
                ours = measure_ours(stack, broker.bootstrap_servers, settings, args.rate, seconds, args.warmup,
                                    pids, args.drain_timeout, watchers)
            finally:
                faults, samples = injector.faults, sampler.samples
        print_ours(ours)
        note_recoveries(faults, ours.visibility)
        series = build_series(ours, samples, faults, args)
        series_file = args.series or (args.plot or work) / f"{args.name}-series.json"  # beside the figures
        series_file.parent.mkdir(parents=True, exist_ok=True)
        series_file.write_text(json.dumps(series))
        print(f"series: {series_file}")
        if args.plot is not None:
            print("figures: " + ", ".join(str(p) for p in draw(series, args.plot, args.name)))
        if not args.no_spark:
            create_topics(broker.bootstrap_servers, ["spark_in", "spark_out"])
            spark = measure_spark_streaming(connect.url, broker.bootstrap_servers, "spark_in", "spark_out", args.rate,
                                            seconds, work / "spark-checkpoint", args.warmup, args.drain_timeout)
            print_stream(spark)
    load_after = os.getloadavg()
    print(f"\nload average {load_before[0]:.1f} before, {load_after[0]:.1f} after ({os.cpu_count()} cores)")
    print_stream(ours.stream)
    if spark is not None:
        print_stream(spark)
        print(f"ours / Spark's: p50 {ours.stream.latency_s['p50'] / spark.latency_s['p50']:.1f}x, "
              f"p99 {ours.stream.latency_s['p99'] / spark.latency_s['p99']:.1f}x; output records/s "
              f"{ours.stream.sustained_records_per_s / max(spark.sustained_records_per_s, 1e-9):.2f}x (sustained)")
    print(json.dumps({"ours": ours.summary(), "spark": asdict(spark) if spark else None,
                      "load": [load_before, load_after], "tuned": args.tuned, "rate": args.rate,
                      "minutes": args.minutes}, default=str))
    failed, retried = failed_tasks(ours.timeline)
    print(f"task instances: {failed} failed, {retried} retried, over {len(ours.timeline)} runs; visibility consumer: "
          f"{ours.stream.records} records, exact: {ours.stream.exactness.exact}")
    checks = [Check("exact", ours.stream.exactness.exact, str(ours.stream.exactness))]
    if faults:
        for fault in faults:
            print(f"fault {fault.component}: planned at {fault.at:.0f} s, killed at {seconds_or_dash(fault.killed)}, "
                  f"back at {seconds_or_dash(fault.returned)}, down {seconds_or_dash(fault.down_s)}, recovery "
                  f"{seconds_or_dash(fault.recovery_s)}")
        visible = ours.visibility.visible_s
        checks += fault_checks(faults, visible[-1] if visible else 0.0)
    if args.drift_checks:
        checks += drift_checks(ours, samples, seconds, args.retention_batches,
                               {"connect server" if f.component == "connect" else f.component for f in faults})
        print_heaps(samples, seconds)
    print("checks:")
    if not print_checks(checks):
        print("FAILED: " + ", ".join(c.name for c in checks if not c.ok), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
