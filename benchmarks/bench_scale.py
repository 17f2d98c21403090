"""Scale: a topic of 1,000 partitions, and 100 pipelines sharing one PostgreSQL ledger with 20 of them at once.

Against the real Kafka broker of devtools/kafka_broker.py and a throwaway PostgreSQL of devtools/postgres.py, both
on 127.0.0.1 (nothing of either is faked). Every measured step goes through the protocol as the tasks run it:
plan = core.planning.plan_batch on a BatchCoordinator with the real KafkaOffsetSource (recovery first, the
committed positions, partitions, log starts and last stable offsets from Kafka, the ledger write), write = claim
+ stage + prepare (not timed; the Parquet marker sink of tests/harness.py writes one small file, no Spark),
notify_complete = BatchCoordinator.commit + BatchCoordinator.retain. Each task opens its own Ledger (engine,
connection, schema check), as each task process does.

partitions   one pipeline reading one topic of N partitions (default 12, 100, 300, 1,000), on a SQLite file and
             on PostgreSQL. The first plan of a pipeline registers every partition (shown apart); then --rounds
             batches, each taking --records offsets of every partition. Per N: plan and notify_complete (median),
             and the ledger rows one batch adds (every table counted before and after; retention is off, so
             nothing is pruned under the count).
concurrent   --pipelines pipelines (default 100), each its own topic of 2 partitions, on one PostgreSQL ledger;
             --concurrent processes (default 20) plan at the same moment (a barrier), write, then commit at the
             same moment, each round on the next 20 pipelines. p50 / p99 of plan and notify_complete over every
             step of every round, beside the same steps one pipeline at a time (the ratio), and every error
             that reached the caller (none is expected: a serialization failure or a lock wait that surfaced
             would fail a task).

Prints each figure, the medians, the ratios to the smallest topic, and the load average (2 shared cores: read the
ratios and the shape of the curve more than the milliseconds).

    PYTHONPATH=. python benchmarks/bench_scale.py [--part partitions|concurrent|both] [--partitions 12,100,300,1000]
        [--rounds 7] [--history 40] [--records 2] [--backend sqlite|postgresql|both] [--pipelines 100] [--concurrent 20]
        [--concurrent-rounds 10] [--profile PARTITIONS]
    PYTHONPATH=. python benchmarks/bench_scale.py --rounds 2 --history 2 --concurrent-rounds 2   # a smoke run
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import os
import pstats
import shutil
import statistics
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import sqlalchemy as sa
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.ledger import Ledger, metadata
from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.planning import plan_batch
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks import pipeline_committer
from devtools.kafka_broker import LocalKafkaBroker
from devtools.postgres import LocalPostgres
from tests.harness import MarkerWriter, pipeline_config

CONCURRENT_PARTITIONS = 2  # partitions of each topic of the concurrent part
STEP_FIGURES = ("plan", "notify_complete", "plan kafka", "plan cpu", "notify cpu")


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=120_000)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)], timeout_ms=120_000)
    finally:
        admin.close()


def fill(bootstrap: str, topics: dict[str, int], per_partition: int) -> None:
    """`per_partition` records of 100 bytes into every partition of every topic ({topic: partitions})."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=64 * 1024)
    value = b"x" * 100
    try:
        for topic, count in topics.items():
            for partition in range(count):
                for _ in range(per_partition):
                    producer.send(topic, value, partition=partition)
        producer.flush(timeout=300)
    finally:
        producer.close()


def config_for(pipeline_id: str, topic: str, bootstrap: str, work: Path, records: int) -> PipelineConfig:
    return pipeline_config(pipeline_id, [topic], {"type": "parquet", "path": str(work / "out" / pipeline_id)},
                           bootstrap=bootstrap, max_records_per_partition=records, retention_batches=None,
                           retention_days=None)


class TimedSource:
    """The real KafkaOffsetSource, with the seconds spent in it (connecting, asking, closing) added up: the plan's
    Kafka share, the rest being the ledger's and the planner's own."""

    def __init__(self, settings: KafkaSettings, clock: dict[str, float]) -> None:
        self.clock = clock
        started = time.perf_counter()
        self.source = KafkaOffsetSource(settings)
        self.clock["kafka"] += time.perf_counter() - started

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.source, name)

        def timed(*args: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args)
            finally:
                self.clock["kafka"] += time.perf_counter() - started
        return timed


class Task:
    """One pipeline's tasks, each with its own Ledger (a task process opens its own engine)."""

    def __init__(self, config: PipelineConfig, url: str) -> None:
        self.config = config
        self.url = url
        self.settings = KafkaSettings.of(config)
        self.runs = 0
        # CPU seconds of the last step, every thread of this process (Kafka's network thread too): what 20 steps
        # at once share of the machine's cores.
        self.cpu: dict[str, float] = {}
        self.clock = {"kafka": 0.0}  # seconds of the last plan spent asking Kafka

    def _coordinator(self) -> BatchCoordinator:
        return BatchCoordinator(self.config, Ledger(self.url), pipeline_committer(self.config))

    def plan(self) -> tuple[BatchId | None, float]:
        self.runs += 1
        coordinator = self._coordinator()
        self.clock = {"kafka": 0.0}
        started, cpu = time.perf_counter(), time.process_time()
        outcome = plan_batch(coordinator, lambda: TimedSource(self.settings, self.clock), f"scale-{self.runs}")
        seconds, self.cpu["plan"] = time.perf_counter() - started, time.process_time() - cpu
        coordinator.ledger.engine.dispose()
        if not outcome.needs_commit:
            raise RuntimeError(f"plan of {self.config.pipeline_id} wrote nothing to commit: {outcome.message}")
        return outcome.batch.id, seconds

    def write(self, batch_id: BatchId) -> None:
        writer = self._coordinator()
        claimed = writer.claim(batch_id)
        writer.prepare(claimed, MarkerWriter.of(self.config).stage(None, claimed, None), 1, 1)
        writer.ledger.engine.dispose()

    def notify(self, batch_id: BatchId) -> float:
        notify = self._coordinator()
        started, cpu = time.perf_counter(), time.process_time()
        notify.commit(batch_id)
        notify.retain()
        seconds, self.cpu["notify_complete"] = time.perf_counter() - started, time.process_time() - cpu
        notify.ledger.engine.dispose()
        return seconds

    def batch(self) -> dict[str, float]:
        batch_id, plan_s = self.plan()
        self.write(batch_id)
        notify_s = self.notify(batch_id)
        return {"plan": plan_s, "notify_complete": notify_s, "plan kafka": self.clock["kafka"], "plan cpu": self.cpu["plan"],
                "notify cpu": self.cpu["notify_complete"]}


def ledger_rows(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar() for t in metadata.sorted_tables}
    finally:
        engine.dispose()


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


# -- part a: one topic of N partitions ------------------------------------------------------------------------------

def run_partitions(backend: str, url_of: Callable[[str], str], bootstrap: str, work: Path,
                   args: argparse.Namespace) -> dict[int, dict[str, Any]]:
    print(f"\n== {backend}: one topic of N partitions; after {args.history} batches of history, {args.rounds} "
          f"batches of {args.records} records per partition each ==", flush=True)
    curve: dict[int, dict[str, Any]] = {}
    for count in args.partitions:
        topic = f"scale-{count}"
        task = Task(config_for(f"{topic}-{backend.lower()}", topic, bootstrap, work, args.records),
                    url_of(f"scale_{count}"))
        batch_id, first_plan = task.plan()
        task.write(batch_id)
        first_notify = task.notify(batch_id)
        for _ in range(args.history):  # a history longer than one page of committed positions (_NEWEST_PAGE)
            task.batch()
        samples, rows = [], []
        for _ in range(args.rounds):
            before = ledger_rows(task.url)
            samples.append(task.batch())
            after = ledger_rows(task.url)
            rows.append({name: after[name] - before[name] for name in after if after[name] != before[name]})
        figures = {op: statistics.median(s[op] for s in samples) for op in STEP_FIGURES}
        figures.update(first_plan=first_plan, first_notify=first_notify, rows=rows[-1],
                       max_plan=max(s["plan"] for s in samples))
        curve[count] = figures
        row_text = ", ".join(f"{name} {n}" for name, n in sorted(rows[-1].items()))
        print(f"{count:>5} partitions: first plan {ms(first_plan)} (registers them), first notify "
              f"{ms(first_notify)}; plan {ms(figures['plan'])} (max {ms(figures['max_plan'])}, Kafka "
              f"{ms(figures['plan kafka'])}, CPU "
              f"{ms(figures['plan cpu'])}), notify_complete {ms(figures['notify_complete'])} (CPU "
              f"{ms(figures['notify cpu'])}); rows per batch: {sum(rows[-1].values())} ({row_text})", flush=True)
        if args.profile == count:
            profile_plan(task, work / f"plan-{backend}-{count}.prof")
    base = curve[min(curve)]
    print(f"{'partitions':>10} {'first plan':>12} {'plan':>12} {'ratio':>7} {'plan CPU':>12} {'notify':>12} "
          f"{'ratio':>7} {'notify CPU':>12} {'rows/batch':>11}")
    for count, f in curve.items():
        print(f"{count:>10} {ms(f['first_plan']):>12} {ms(f['plan']):>12} {f['plan'] / base['plan']:>6.2f}x "
              f"{ms(f['plan cpu']):>12} {ms(f['notify_complete']):>12} "
              f"{f['notify_complete'] / base['notify_complete']:>6.2f}x {ms(f['notify cpu']):>12} "
              f"{sum(f['rows'].values()):>11}")
    return curve


def profile_plan(task: Task, out: Path) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    batch_id, _ = task.plan()
    profiler.disable()
    task.write(batch_id)
    task.notify(batch_id)
    profiler.dump_stats(str(out))
    print(f"-- cProfile of one plan ({out}), by cumulative time:")
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


# -- part b: many pipelines, some at once ------------------------------------------------------------------------------

def _worker(index: int, rounds: int, concurrent: int, pipelines: list[tuple[PipelineConfig, str]],
            barrier: Any, results: Any) -> None:
    """One task slot: in round r it runs pipeline (r * concurrent + index) % len(pipelines), in step with the others."""
    tasks = [Task(config, url) for config, url in pipelines]
    for round_ in range(rounds):
        task = tasks[(round_ * concurrent + index) % len(tasks)]
        task.runs = 1000 + round_  # run ids of their own
        sample: dict[str, Any] = {"pipeline": task.config.pipeline_id}
        batch_id = None
        try:
            barrier.wait(timeout=300)
            batch_id, sample["plan"] = task.plan()
            sample["plan cpu"], sample["plan kafka"] = task.cpu["plan"], task.clock["kafka"]
            task.write(batch_id)
        except Exception:  # noqa: BLE001 - every error is the figure this part looks for
            sample["error"] = traceback.format_exc()
        try:
            barrier.wait(timeout=300)
            if batch_id is not None:
                sample["notify_complete"] = task.notify(batch_id)
                sample["notify cpu"] = task.cpu["notify_complete"]
        except Exception:  # noqa: BLE001
            sample.setdefault("error", traceback.format_exc())
        results.put(sample)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def run_concurrent(url: str, bootstrap: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    print(f"\n== PostgreSQL: {args.pipelines} pipelines on one ledger, {args.concurrent} planning and committing at "
          f"the same moment, {args.concurrent_rounds} rounds ==", flush=True)
    topics = {f"many-{i:03d}": CONCURRENT_PARTITIONS for i in range(args.pipelines)}
    for topic, count in topics.items():
        create_topic(bootstrap, topic, count)
    uses = -(-args.concurrent * args.concurrent_rounds // args.pipelines)  # batches per pipeline, at most
    fill(bootstrap, topics, args.records * (uses + 3))
    pipelines = [(config_for(f"many-{i:03d}", topic, bootstrap, work, args.records), url)
                 for i, topic in enumerate(topics)]
    started = time.perf_counter()
    for config, _ in pipelines:  # each pipeline's first batch (registers its partitions), one after the other
        Task(config, url).batch()
    print(f"{args.pipelines} pipelines set up (a first batch each) in {time.perf_counter() - started:.1f} s",
          flush=True)
    # The reference: the same steps one at a time (a second batch of the first --concurrent pipelines).
    alone = []
    for config, _ in pipelines[:args.concurrent]:
        task = Task(config, url)
        task.runs = 500  # run ids of their own
        alone.append(task.batch())
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(args.concurrent), context.Queue()
    workers = [context.Process(target=_worker, args=(i, args.concurrent_rounds, args.concurrent, pipelines,
                                                      barrier, results)) for i in range(args.concurrent)]
    for worker in workers:
        worker.start()
    samples = [results.get(timeout=1800) for _ in range(args.concurrent * args.concurrent_rounds)]
    for worker in workers:
        worker.join(timeout=60)
    errors = [s for s in samples if "error" in s]
    figures: dict[str, Any] = {"errors": errors, "steps": len(samples)}
    print(f"{'step':<16} {'p50':>12} {'p99':>12} {'max':>12} {'steps':>6} {'alone p50':>12} {'p50 ratio':>10}")
    for op in STEP_FIGURES:
        values = [s[op] for s in samples if op in s]
        figures[op] = (percentile(values, 50), percentile(values, 99), max(values))
        reference = statistics.median(a[op] for a in alone)
        print(f"{op:<16} {ms(figures[op][0]):>12} {ms(figures[op][1]):>12} {ms(figures[op][2]):>12} {len(values):>6} "
              f"{ms(reference):>12} {figures[op][0] / reference:>9.2f}x")
    cpu = statistics.median(a["plan cpu"] + a["notify cpu"] for a in alone)
    print(f"CPU of one plan + notify_complete in this process alone: {ms(cpu)}; {args.concurrent} at once need "
          f"{ms(cpu * args.concurrent / (os.cpu_count() or 1))} of all {os.cpu_count()} cores, before PostgreSQL's "
          "and Kafka's share")
    print(f"errors that reached a task: {len(errors)}")
    for sample in errors[:5]:
        print(f"-- {sample['pipeline']}:\n{sample['error']}")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["partitions", "concurrent", "both"], default="both")
    parser.add_argument("--partitions", type=lambda s: [int(n) for n in s.split(",")], default=[12, 100, 300, 1000])
    parser.add_argument("--rounds", type=int, default=7, help="measured batches per topic (the median is shown)")
    parser.add_argument("--records", type=int, default=2, help="offsets per partition per batch")
    parser.add_argument("--history", type=int, default=40,
                        help="batches run (not timed) before the measured ones, per topic and backend")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--pipelines", type=int, default=100)
    parser.add_argument("--concurrent", type=int, default=20)
    parser.add_argument("--concurrent-rounds", type=int, default=10)
    parser.add_argument("--profile", type=int, default=None, help="print a cProfile of one plan at this many partitions")
    args = parser.parse_args()
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="aeo-bench-scale-"))
    broker = LocalKafkaBroker(work / "kafka").start()
    server = None
    try:
        if args.part in ("partitions", "both"):
            started = time.perf_counter()
            for count in args.partitions:
                create_topic(broker.bootstrap_servers, f"scale-{count}", count)
            fill(broker.bootstrap_servers, {f"scale-{n}": n for n in args.partitions}, args.records * (args.history + args.rounds + 4))
            print(f"topics created and filled in {time.perf_counter() - started:.1f} s", flush=True)
        needs_pg = args.part == "concurrent" or args.backend in ("postgresql", "both")
        if needs_pg:
            server = LocalPostgres(work / "pg", extra_config={"max_connections": "200"}).start()
        if args.part in ("partitions", "both"):
            if args.backend in ("sqlite", "both"):
                run_partitions("SQLite", lambda db: f"sqlite:///{work / (db + '.db')}", broker.bootstrap_servers,
                               work, args)
            if args.backend in ("postgresql", "both"):
                run_partitions("PostgreSQL", server.create_database, broker.bootstrap_servers, work, args)
        if args.part in ("concurrent", "both"):
            run_concurrent(server.create_database("many"), broker.bootstrap_servers, work, args)
    finally:
        if server is not None:
            server.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nload average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
