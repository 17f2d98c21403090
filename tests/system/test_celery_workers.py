"""Issue 47: the Kafka example's pipeline on Airflow's CeleryExecutor with two Celery workers, as platforms run it.

The stack (devtools.airflow_stack with CeleryWorkers): scheduler, dag-processor and api-server on the PostgreSQL
metadata database (also Celery's result backend), Redis from Debian as the broker, and two `airflow celery worker`s,
A and B, each with its own AIRFLOW_HOME and working directory, as on machines of their own. The pipeline's ledger is
PostgreSQL, its write runs on the warm Spark Connect server (tests/dags/eo_celery_test_dag.py routes the tasks).

One DAG run proves, with real processes only: plan runs on A, write on either, notify_complete on B (Airflow's task
instances say where: each worker reports its own name as the host name, and the attempt's log lands in that worker's
AIRFLOW_HOME only); the worker running the write is SIGKILLed whole (its Celery processes, the task's supervisor and
the task, frozen at the named fault point `write.after_stage` with its Kafka transactions open); Redis is SIGKILLed
and restarted on its append-only file while the batch waits for its retry; the retry runs on the other worker, and
the output is exact, no transaction is left open, the ledger holds one COMMITTED batch.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import psutil
import pytest

from airflow_exactly_once.core.faults import ENV as FAULTS_ENV
from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.states import BatchState
from devtools.airflow_stack import AirflowStack, CeleryWorkers
from tests.dags.eo_celery_test_dag import DAG_ID, LEDGER_CONN_ID, NOTIFY_QUEUE, PLAN_QUEUE, SHARED_QUEUE
from tests.helpers import assert_exactly_once, assert_ranges_tile, create_topic, produce, wait_for
from tests.kafka_helpers import read_all

REPO = Path(__file__).resolve().parents[2]
RECORDS = 300
SPARK_CONN_ID = "eo_celery_spark"
INPUT, OUTPUT = "celery_events", "celery_events_out"
WORKER_QUEUES = {"a": (PLAN_QUEUE, SHARED_QUEUE), "b": (NOTIFY_QUEUE, SHARED_QUEUE)}


@pytest.fixture(scope="module")
def celery_faults(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("celery-faults")


@pytest.fixture(scope="module")
def celery_ledger(postgres) -> str:
    return postgres.create_database("celery_ledger")


@pytest.fixture(scope="module")
def celery_airflow(kafka, postgres, airflow_database, redis_broker, spark_connect, celery_ledger, celery_faults,
                   tmp_path_factory):
    """Airflow on the CeleryExecutor with workers A and B (their queues: WORKER_QUEUES)."""
    root = tmp_path_factory.mktemp("celery-airflow")
    database = airflow_database.create_database("airflow_celery")
    env = {
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka",
                                                  "extra": {"bootstrap.servers": kafka.bootstrap_servers}}),
        f"AIRFLOW_CONN_{LEDGER_CONN_ID.upper()}": json.dumps({
            "conn_type": "postgres", "host": "127.0.0.1", "port": postgres.port, "login": "postgres",
            "schema": "celery_ledger"}),
        f"AIRFLOW_CONN_{SPARK_CONN_ID.upper()}": json.dumps(spark_connect.connection()),
        "EO_CELERY_SPARK_CONN_ID": SPARK_CONN_ID, "EO_CELERY_INPUT": INPUT, "EO_CELERY_OUTPUT": OUTPUT,
        FAULTS_ENV: str(celery_faults),
        "PYTHONPATH": os.pathsep.join([str(root / "dags"), str(REPO), os.environ.get("PYTHONPATH", "")]),
        # A dead worker's task is failed (and retried) 15 s after its last heartbeat, not 60.
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "15",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "3",
    }
    dag_files = [REPO / "tests" / "dags" / "eo_celery_test_dag.py", REPO / "tests" / "dags" / "eo_kafka_transforms.py"]
    stack = AirflowStack(root, dag_files, env, reparse_seconds=3600, database_url=database,
                         celery=CeleryWorkers(redis_broker.url(), WORKER_QUEUES))
    stack.start()
    yield stack
    stack.stop()


def tries(stack: AirflowStack, run_id: str, task: str) -> list[dict]:
    """Every attempt of a task of the run (Airflow's task instance history and its current try), oldest first."""
    task_id = f"exactly_once.{task}"
    found = stack.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/tries")["task_instances"]
    return sorted(found, key=lambda t: t["try_number"])


def attempt_logs(stack: AirflowStack, worker: str, run_id: str) -> set[tuple[str, int]]:
    """(task, attempt) of every task log in the worker's own AIRFLOW_HOME."""
    folder = stack.worker_home(worker) / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}"
    return {(log.parent.name.rpartition(".")[2], int(re.search(r"attempt=(\d+)", log.name)[1]))
            for log in folder.glob("task_id=*/attempt=*.log")}


def test_plan_write_notify_on_two_celery_workers_a_worker_killed_mid_write_and_redis_restarted(
        kafka, redis_broker, celery_airflow, celery_ledger, celery_faults):
    stack = celery_airflow
    create_topic(kafka.bootstrap_servers, INPUT, partitions=3)
    create_topic(kafka.bootstrap_servers, OUTPUT, partitions=3)
    sent = [value.upper() for value in produce(kafka.bootstrap_servers, INPUT, RECORDS)]
    arm(celery_faults, "write.after_stage", "stop")  # the write stays there, its transactions open
    stack.wait_for_dag(DAG_ID)
    run_id = "celery-1"
    stack.trigger(DAG_ID, run_id)

    fired = wait_for(lambda: re.search(r"write.after_stage stop pid=(\d+)", _read(celery_faults / "fired.log")),
                     "the write's first attempt to reach write.after_stage", stack=stack)
    task_pid = int(fired[1])
    [first] = tries(stack, run_id, "write")
    victim = first["hostname"]
    survivor = ({"a", "b"} - {victim}).pop()
    assert first["try_number"] == 1 and first["queue"] == SHARED_QUEUE and victim in WORKER_QUEUES, first
    assert ("write", 1) in attempt_logs(stack, victim, run_id)
    assert psutil.Process(task_pid).status() == psutil.STATUS_STOPPED  # the write, held at the fault point
    stack.kill_worker(victim)  # the whole worker, as a machine lost mid-write (returns once all of it is gone)
    assert not _runs(task_pid)
    redis_broker.kill()  # the broker too, while the batch waits for its retry; back on its append-only file
    redis_broker.start()
    assert stack.run_state(DAG_ID, run_id) == "running"

    retry = wait_for(lambda: [t for t in tries(stack, run_id, "write")
                              if t["try_number"] == 2 and t["state"] in ("running", "success")],
                     "the write's retry to start", stack=stack)
    assert retry[0]["hostname"] == survivor, retry  # the only worker left on the shared queue
    stack.start_worker(victim)  # the lost machine comes back (B serves notify_complete's queue)
    assert stack.wait_run(DAG_ID, run_id, timeout=600) == "success"

    # Where each task ran: Airflow's task instances (the worker's name as host name, the queue) and the logs.
    where = {task: [(t["try_number"], t["state"], t["hostname"], t["queue"]) for t in tries(stack, run_id, task)]
             for task in ("plan", "write", "notify_complete")}
    assert where == {"plan": [(1, "success", "a", PLAN_QUEUE)],
                     "write": [(1, "failed", victim, SHARED_QUEUE), (2, "success", survivor, SHARED_QUEUE)],
                     "notify_complete": [(1, "success", "b", NOTIFY_QUEUE)]}, where
    logs = {"a": {("plan", 1)}, "b": {("notify_complete", 1)}}  # each attempt's log only where it ran
    logs[victim].add(("write", 1))
    logs[survivor].add(("write", 2))
    assert {worker: attempt_logs(stack, worker, run_id) for worker in WORKER_QUEUES} == logs
    assert _read(celery_faults / "fired.log").count("write.after_stage") == 1

    # Exact output, nothing open: read_all settles only once no transaction is open on the topic; the killed
    # attempt's records are in the log, aborted.
    assert_exactly_once(sent, read_all(kafka.bootstrap_servers, OUTPUT))
    assert sorted(read_all(kafka.bootstrap_servers, OUTPUT, "read_uncommitted")) == sorted(sent * 2)
    ledger = Ledger(celery_ledger)
    [batch] = ledger.list_batches(DAG_ID)
    assert batch.state is BatchState.COMMITTED and batch.input_records == RECORDS and batch.run_id == run_id
    assert ledger.list_batches(DAG_ID, [BatchState.PLANNED, BatchState.PREPARED]) == []
    assert_ranges_tile(ledger, DAG_ID)
    assert ledger.committed_positions(DAG_ID) == {(INPUT, p): RECORDS // 3 for p in range(3)}


def _runs(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
