"""Kafka -> Kafka on a real 3-node cluster (devtools/kafka_cluster.py: KRaft, replication factor 3,
min.insync.replicas=2), with the transaction coordinator's node or an output partition's leader SIGKILLed while a
task is in the middle of its step.

Each run is a pipeline's plan, write and notify_complete in a worker process of its own (tests/worker_tasks.py: the
operators' `execute`, Spark in that process). A fault point armed with `pause` stops the process at the exact step
(core/faults.py); the test kills a node, then lets the process go on. A step that fails must fail retriably (the
operators' mapping: not AirflowFailException) and is run again, as Airflow's retry would. Each case ends with every
input record once in the read_committed output, the batch COMMITTED in the ledger, and no transaction of the pipeline
left open on any coordinator (ListTransactions on every node). The Kafka case of the sink contract
(tests/integration/test_sink_contract.py) runs on the cluster too.

Only the cluster stage runs this file (`make stage-kafka-cluster`; the primary run leaves it out): one cluster for the
stage, not one per test worker.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from airflow_exactly_once.core.faults import ENV as FAULTS_ENV
from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.hooks.ledger import EMBEDDED_LEDGER_FILE
from devtools.kafka_cluster import LocalKafkaCluster
from tests.helpers import assert_exactly_once, produce, read_parquet
from tests.integration.test_sink_contract import (  # noqa: F401 - the contract's cases, collected here on the cluster
    KafkaUnderTest,
    pipe,
    test_a_fenced_attempt_never_becomes_visible,
    test_a_lost_prepare_is_reported_and_the_range_freed,
    test_abort_removes_the_staged_output,
    test_output_is_invisible_until_commit_and_commit_is_idempotent,
)
from tests.kafka_helpers import read_all
from tests.worker_tasks import STEPS

pytestmark = pytest.mark.kafka_cluster

REPO = Path(__file__).resolve().parents[2]
RECORDS = 90
ATTEMPTS = 3  # a step's tries, as a task with retries=2


class RetriedStep(UserWarning):
    """A step failed retriably on the cluster and ran again: shown in the stage's warnings summary."""


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory) -> LocalKafkaCluster:
    with LocalKafkaCluster(tmp_path_factory.mktemp("kafka-cluster")) as cluster:
        yield cluster


# --------------------------------------------------------------------------- the sink contract on the cluster


class ClusterKafkaUnderTest(KafkaUnderTest):
    """The contract's Kafka adapter with its output topic replicated on all three nodes."""

    def __init__(self, request, tmp_path: Path) -> None:
        self.kafka = request.getfixturevalue("kafka_cluster")
        self.topic = f"contract-{uuid.uuid4().hex[:8]}"
        self.kafka.create_topic(self.topic, partitions=2)
        self.spec = {"type": "kafka", "topic": self.topic, "bootstrap_servers": self.kafka.bootstrap_servers}


@pytest.fixture
def sink(request, tmp_path) -> ClusterKafkaUnderTest:
    return ClusterKafkaUnderTest(request, tmp_path)


# --------------------------------------------------------------------------- a pipeline in a worker process


@dataclass
class Run:
    """One pipeline on the cluster, its tasks run by worker processes under one AIRFLOW_HOME."""

    cluster: LocalKafkaCluster
    pipeline: dict[str, Any]
    home: Path
    faults: Path
    sent: list[str]
    retried: list[dict[str, Any]] = field(default_factory=list)  # the errors of failed (and retried) steps
    killed: list[tuple[str, int]] = field(default_factory=list)  # (fault point, node id) of each SIGKILL
    run_id: str = "manual__1"  # the DAG run the worker's tasks belong to (a retry keeps it)

    @property
    def pipeline_id(self) -> str:
        return self.pipeline["pipeline_id"]

    @property
    def output(self) -> str:
        return self.pipeline["sink"]["topic"]

    def env(self) -> dict[str, str]:
        return {**os.environ, "AIRFLOW_HOME": str(self.home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                FAULTS_ENV: str(self.faults),
                "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
                "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
                    {"conn_type": "kafka", "extra": {"bootstrap.servers": self.cluster.bootstrap_servers}})}

    def start(self, steps: tuple[str, ...], batch_id: str | None = None) -> subprocess.Popen:
        request = {"dag_id": self.pipeline_id, "pipeline": self.pipeline, "run_id": self.run_id,
                   "steps": list(steps), "batch_id": batch_id}
        return subprocess.Popen([sys.executable, "-m", "tests.worker_tasks", json.dumps(request)], cwd=REPO,
                                env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def paused_at(self, point: str, worker: subprocess.Popen, timeout: float = 300.0) -> int:
        """The pid of the worker process that the `pause` fault stopped at `point`."""
        fired = self.faults / "fired.log"
        deadline = time.monotonic() + timeout
        while True:
            for line in fired.read_text().splitlines() if fired.exists() else ():
                name, action, pid = line.split()
                if name == point and action == "pause":
                    return int(pid.removeprefix("pid="))
            if worker.poll() is not None:
                raise AssertionError(f"the worker ended before reaching {point}: {worker.stderr.read()[-4000:]}")
            assert time.monotonic() < deadline, f"the worker never reached {point}"
            time.sleep(0.2)

    def finish(self, worker: subprocess.Popen) -> dict[str, Any]:
        """The worker's report; a failed step is run again (with the steps after it) while it failed retriably."""
        out, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err[-4000:]
        report = json.loads(out.strip().splitlines()[-1])
        for _ in range(ATTEMPTS - 1):
            if "error" not in report:
                break
            error = report["error"]
            assert error["type"] != "AirflowFailException", f"{error['step']} failed for good: {error['message']}"
            self.retried.append(error)
            warnings.warn(f"{self.pipeline_id}: {error['step']} failed retriably ({error['type']}: "
                          f"{error['message'][:300]}); run again, as Airflow's retry would", RetriedStep)
            again = self.start(STEPS[STEPS.index(error["step"]):], report["batch_id"])
            out, err = again.communicate(timeout=600)
            assert again.returncode == 0, err[-4000:]
            report = {**json.loads(out.strip().splitlines()[-1]), "batch_id": report["batch_id"]}
        assert "error" not in report, f"still failing after {ATTEMPTS} attempts: {report['error']}"
        return report

    def ledger(self) -> Ledger:
        return Ledger(f"sqlite:///{self.home / EMBEDDED_LEDGER_FILE}")

    def assert_exact(self, batch_id: str) -> None:
        """Every record once under read_committed, the batch COMMITTED, no transaction of the pipeline open."""
        assert self.ledger().get_batch(BatchId.parse(batch_id)).state is BatchState.COMMITTED
        assert_exactly_once(self.sent, read_all(self.cluster.bootstrap_servers, self.output))
        assert self.cluster.open_transactions(self.pipeline_id) == {}


@pytest.fixture
def run(kafka_cluster, tmp_path) -> Run:
    name = f"cluster_{uuid.uuid4().hex[:8]}"
    source, output = f"{name}-in", f"{name}-out"
    kafka_cluster.create_topic(source, partitions=3)
    kafka_cluster.create_topic(output, partitions=2)
    sent = produce(kafka_cluster.bootstrap_servers, source, RECORDS)
    pipeline = {"pipeline_id": name, "topics": source, "startup_mode": "earliest",
                "sink": {"type": "kafka", "topic": output}}
    (tmp_path / "home").mkdir()
    return Run(kafka_cluster, pipeline, tmp_path / "home", tmp_path / "faults", sent)


@dataclass(frozen=True)
class Fault:
    """SIGKILL the node `victim` names while the worker waits at `point`; then `while_down` (if given) runs before
    the worker goes on, with the node still down and the worker's transactions as it left them."""

    point: str
    victim: Callable[[Run], int]
    while_down: Callable[[Run], None] | None = None


def run_with_faults(run: Run, faults: tuple[Fault, ...]) -> dict[str, Any]:
    """A whole run (plan, write, notify_complete) in one worker that pauses at each fault's point, where the
    fault's node is SIGKILLed; then the worker goes on. A node killed before the last fault is restarted while the
    worker goes on (at most one node is down at a time: two live replicas are what min.insync.replicas=2 needs);
    the last fault's node stays down until the run is over, so the step after it runs wholly with a dead node in
    the clients' cached metadata. Failed steps are retried (Run.finish)."""
    for fault in faults:
        arm(run.faults, fault.point, "pause")
    worker = run.start(STEPS)
    for index, fault in enumerate(faults):
        pid = run.paused_at(fault.point, worker)
        node = fault.victim(run)
        run.cluster.kill(node)
        run.killed.append((fault.point, node))
        if fault.while_down is not None:
            fault.while_down(run)
        os.kill(pid, signal.SIGCONT)
        if index + 1 < len(faults):
            run.cluster.restart(node)  # the worker goes on meanwhile, with the node down until here
    try:
        return run.finish(worker)
    finally:
        run.cluster.restart(run.killed[-1][1])


def assert_notify_complete_not_retried(run: Run) -> None:
    """notify_complete asks the brokers that are alive (sinks/kafka/live_cluster.py): a dead node costs no retry."""
    retried = [f"{e['type']}: {e['message'][:300]}" for e in run.retried if e["step"] == "notify_complete"]
    assert retried == [], f"notify_complete needed a retry after a node's SIGKILL: {retried}"


def coordinator_of_open_transaction(run: Run) -> int:
    """The coordinator node of one of the pipeline's open transactions (the write has pre-committed them)."""
    open_ids = run.cluster.open_transactions(run.pipeline_id)
    assert open_ids, "the write should hold its transactions open here"
    return run.cluster.transaction_coordinator(sorted(open_ids)[0])


def transactions_list_answers(run: Run) -> None:
    """`airflow-exactly-once transactions list` a moment after a node's SIGKILL: it lists the write's open
    transactions (asked around the dead node, sinks/kafka/live_cluster.py) instead of failing to reach it."""
    listed = subprocess.run([sys.executable, "-m", "airflow_exactly_once.cli", "--ledger-url",
                             f"sqlite:///{run.home / EMBEDDED_LEDGER_FILE}", "--json", "transactions", "list",
                             run.pipeline_id], cwd=REPO, env=run.env(), capture_output=True, text=True, timeout=120)
    assert "Traceback" not in listed.stderr, listed.stderr[-3000:]  # before: KafkaConnectionError 111 ECONNREFUSED
    assert listed.returncode == 1, f"exit {listed.returncode} (1: transactions listed): {listed.stderr[-3000:]}"
    rows = json.loads(listed.stdout)
    opened = {r["transactional_id"] for r in rows if r["kind"] == "open"}
    assert opened and opened == set(run.cluster.open_transactions(run.pipeline_id)), (rows, listed.stderr[-3000:])
    assert all(re.fullmatch(r"batch \d+ \(PLANNED\)", r["batch"]) for r in rows if r["kind"] == "open"), rows


def leader_of_output(run: Run) -> int:
    """The leader of the output's partition 0 (every write of the batch has records there: 90 over 2 partitions)."""
    return run.cluster.partition_leader(run.output, 0)


# --------------------------------------------------------------------------- the faults
# Two runs of two faults each (a worker's start, Spark's included, is most of a run's time).


def test_an_output_leader_killed_during_the_write_then_the_coordinator_during_notify_complete(run):
    report = run_with_faults(run, (Fault("write.before_stage", leader_of_output),
                                   Fault("notify.before_sink_commit", coordinator_of_open_transaction)))
    run.assert_exact(report["batch_id"])
    assert [point for point, _ in run.killed] == ["write.before_stage", "notify.before_sink_commit"]
    assert_notify_complete_not_retried(run)


def test_the_coordinator_killed_while_the_write_holds_its_transactions_then_an_output_leader_during_the_commit(run):
    report = run_with_faults(run, (Fault("write.after_stage", coordinator_of_open_transaction,
                                         transactions_list_answers),
                                   Fault("notify.before_sink_commit", leader_of_output)))
    run.assert_exact(report["batch_id"])
    assert [point for point, _ in run.killed] == ["write.after_stage", "notify.before_sink_commit"]
    assert_notify_complete_not_retried(run)


# --------------------------------------------------------------------------- a node away for whole runs (issue 61)
# A cluster of three keeps serving with one node away: rolling restarts, maintenance, a lost machine. Kafka 4 lists a
# fenced node in DescribeCluster (which once failed every plan with UnknownBrokerIdError), and a paused node accepts
# connections and answers nothing (which once ate a client's whole bootstrap bound). No step may need a retry.


def assert_no_step_retried(run: Run) -> None:
    retried = [f"{e['step']}: {e['type']}: {e['message'][:300]}" for e in run.retried]
    assert retried == [], f"steps needed a retry while node(s) {sorted(n for _, n in run.killed)} were away: {retried}"


def cli(run: Run, *args: str) -> subprocess.CompletedProcess:
    """`airflow-exactly-once --json ARGS` on the run's ledger, asking the cluster through the pipeline's connection."""
    return subprocess.run([sys.executable, "-m", "airflow_exactly_once.cli", "--ledger-url",
                           f"sqlite:///{run.home / EMBEDDED_LEDGER_FILE}", "--json", *args], cwd=REPO,
                          env=run.env(), capture_output=True, text=True, timeout=120)


def test_the_coordinator_killed_and_left_down_across_whole_runs_to_kafka(run):
    """The node coordinating the write's open transactions is SIGKILLed and stays down: notify_complete commits them
    once the coordinator moved, a second whole run (plan with the sink's check and the hanging sweep, write,
    notify_complete) goes through with the node still down, `transactions list` and `check` answer, a failed write's
    abort ends its transactions, and the next run takes the released range again."""
    arm(run.faults, "write.after_stage", "pause")
    worker = run.start(STEPS)
    pid = run.paused_at("write.after_stage", worker)
    node = coordinator_of_open_transaction(run)
    run.cluster.kill(node)
    run.killed.append(("write.after_stage", node))
    try:
        os.kill(pid, signal.SIGCONT)
        run.assert_exact(run.finish(worker)["batch_id"])
        run.sent += produce(run.cluster.live_bootstrap(), run.pipeline["topics"], RECORDS, start=RECORDS)
        run.run_id = "manual__2"
        second = run.finish(run.start(STEPS))
        run.assert_exact(second["batch_id"])
        listed = cli(run, "transactions", "list", run.pipeline_id)
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr[-3000:]
        assert json.loads(listed.stdout) == [], listed.stdout  # nothing open, and the list did answer
        checked = cli(run, "check", run.pipeline_id, "--without", "asset-events")
        assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
        assert json.loads(checked.stdout)["committed_batches"] == 2
        # A write that fails after staging, and the abort task, with the node still down; the next run takes the
        # released range again.
        run.sent += produce(run.cluster.live_bootstrap(), run.pipeline["topics"], RECORDS, start=2 * RECORDS)
        arm(run.faults, "write.after_stage", "raise")
        run.run_id = "manual__3"
        failed = json.loads(run.start(("plan", "write")).communicate(timeout=600)[0].strip().splitlines()[-1])
        assert failed["error"]["step"] == "write", failed
        aborted = run.start(("abort",), failed["batch_id"]).communicate(timeout=600)[0].strip().splitlines()[-1]
        assert re.search(r"aborted [1-9]\d* open Kafka transaction", json.loads(aborted)["steps"]["abort"]), aborted
        assert run.ledger().get_batch(BatchId.parse(failed["batch_id"])).state is BatchState.ABORTED
        run.run_id = "manual__4"
        run.assert_exact(run.finish(run.start(STEPS))["batch_id"])
    finally:
        run.cluster.restart(node)
    assert_no_step_retried(run)


@pytest.fixture
def parquet_run(run, tmp_path) -> Run:
    run.pipeline["sink"] = {"type": "parquet", "path": str(tmp_path / "out")}
    return run


def test_a_node_killed_and_left_down_for_a_whole_run_to_parquet(parquet_run):
    """The leader of a source partition is SIGKILLed before the run and stays down: the plan's clients bootstrap
    from the nodes that answer and Spark reads from the new leaders; every record lands once."""
    run = parquet_run
    node = run.cluster.partition_leader(run.pipeline["topics"], 0)
    run.cluster.kill(node)
    run.killed.append(("before the run", node))
    try:
        report = run.finish(run.start(STEPS))
        assert run.ledger().get_batch(BatchId.parse(report["batch_id"])).state is BatchState.COMMITTED
        values = [row["value"] for row in read_parquet(Path(run.pipeline["sink"]["path"]))]
        assert_exactly_once(run.sent, [v.decode() if isinstance(v, bytes) else v for v in values])
    finally:
        run.cluster.restart(node)
    assert_no_step_retried(run)


def test_a_node_paused_during_plan(run):
    """A node SIGSTOPped as the plan starts (a long GC pause, a hung machine): the kernel still accepts connections to
    it and nothing answers. The plan's clients bootstrap from the nodes that answer and its per-broker questions
    leave the node out, naming it; the whole run goes through while the node stays paused."""
    arm(run.faults, "plan.before_check", "pause")
    worker = run.start(STEPS)
    pid = run.paused_at("plan.before_check", worker)
    node = run.cluster.partition_leader(run.output, 0)
    run.cluster.pause(node)
    run.killed.append(("plan.before_check", node))
    try:
        os.kill(pid, signal.SIGCONT)
        report = run.finish(worker)
        assert run.ledger().get_batch(BatchId.parse(report["batch_id"])).state is BatchState.COMMITTED
        assert_exactly_once(run.sent, read_all(run.cluster.live_bootstrap(), run.output))
    finally:
        run.cluster.resume(node)
        run.cluster.wait_brokers(len(run.cluster.nodes))
        run.cluster.wait_in_sync()
    assert_no_step_retried(run)
