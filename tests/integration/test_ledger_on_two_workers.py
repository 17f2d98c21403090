"""Issue 52: one pipeline whose tasks run on two Airflow workers, each with its own AIRFLOW_HOME (Celery, Kubernetes).

Each worker is a process of its own (tests/worker_tasks.py: the DAG parsed, then the tasks' `execute`) with its own
AIRFLOW_HOME and AIRFLOW__CORE__EXECUTOR=CeleryExecutor, against the real broker (a Kafka sink, read back
read_committed) and, for the PostgreSQL ledger, the real server. On the default embedded ledger each worker would
keep its own file and the second run would write every record again: the tasks refuse it before anything is
written. With the workers sharing the file (and saying so), or with a PostgreSQL ledger, two runs on the two
workers commit every record exactly once, one batch continuing where the other ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.hooks.ledger import EMBEDDED_LEDGER_FILE
from tests.helpers import assert_exactly_once, assert_ranges_tile, create_topic, produce
from tests.kafka_helpers import read_all
from tests.worker_tasks import STEPS

REPO = Path(__file__).resolve().parents[2]
RECORDS = 120  # per run
SHARED = "AIRFLOW__EXACTLY_ONCE__EMBEDDED_LEDGER_SHARED"
LEDGER_CONN_ID = "eo_two_workers_ledger"
SPARK_CONN_ID = "eo_two_workers_spark"


@dataclass
class Worker:
    """An Airflow worker: its own AIRFLOW_HOME, the deployment's configuration in its environment."""

    name: str
    home: Path
    env: dict[str, str]

    def run(self, pipeline: dict[str, Any], run_id: str, steps: tuple[str, ...] = STEPS,
            batch_id: str | None = None) -> dict[str, Any]:
        """The tasks `steps` of run `run_id` on this worker (tests/worker_tasks.py): what they returned or raised."""
        request = {"dag_id": pipeline["pipeline_id"], "pipeline": pipeline, "run_id": run_id, "steps": list(steps),
                   "batch_id": batch_id}
        done = subprocess.run([sys.executable, "-m", "tests.worker_tasks", json.dumps(request)], cwd=REPO,
                              env=self.env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def topics(kafka, unique) -> tuple[str, str]:
    source, output = f"two-workers-in-{unique}", f"two-workers-out-{unique}"
    for topic in (source, output):
        create_topic(kafka.bootstrap_servers, topic, partitions=3)
    return source, output


@pytest.fixture
def pipeline(topics, unique) -> dict[str, Any]:
    source, output = topics
    return {"pipeline_id": f"two_workers_{unique}", "topics": source, "sink": {"type": "kafka", "topic": output},
            "startup_mode": "earliest"}


def workers(kafka, root: Path, **settings: str) -> tuple[Worker, Worker]:
    """Workers A and B, each with its own AIRFLOW_HOME, under a multi-machine executor; `settings` are the
    deployment's further environment (its connections, [exactly_once] options)."""
    env = {key: value for key, value in os.environ.items() if key != SHARED}
    env.update({"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor", "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka",
                                                          "extra": {"bootstrap.servers": kafka.bootstrap_servers}}),
                **settings})
    pair = []
    for name in ("a", "b"):
        home = root / f"airflow-home-{name}"
        home.mkdir(parents=True)
        pair.append(Worker(name, home, {**env, "AIRFLOW_HOME": str(home)}))
    return pair[0], pair[1]


def test_the_embedded_ledger_on_two_workers_is_refused_before_anything_is_written(kafka, topics, pipeline, tmp_path):
    source, output = topics
    produce(kafka.bootstrap_servers, source, RECORDS)
    a, b = workers(kafka, tmp_path)
    first = a.run(pipeline, "manual__1")
    assert first["error"]["step"] == "plan" and first["error"]["type"] == "AirflowFailException"
    message = first["error"]["message"]
    assert message.startswith(f"ConfigurationError: the embedded SQLite ledger (sqlite:///{a.home}/"
                              f"{EMBEDDED_LEDGER_FILE}) cannot be used under executor CeleryExecutor ([core] executor "
                              "= 'CeleryExecutor')")
    assert "each worker would keep its own ledger" in message
    assert "ledger_conn_id='<connection>'" in message and "[exactly_once] embedded_ledger_shared = True" in message
    assert any(w.startswith(f"EmbeddedLedgerWarning: pipeline {pipeline['pipeline_id']}: its tasks will fail")
               for w in first["parse_warnings"])  # said when the DAG was parsed already
    # The second worker's tasks of the same run (the scheduler may send write there) are refused alike.
    second = b.run(pipeline, "manual__1", steps=("write", "notify_complete"), batch_id=f"{pipeline['pipeline_id']}:1")
    assert second["error"]["step"] == "write" and "ConfigurationError: the embedded SQLite ledger" in \
        second["error"]["message"]
    # Nothing was written: no ledger on either worker (no batch planned), nothing on the output topic.
    assert not (a.home / EMBEDDED_LEDGER_FILE).exists() and not (b.home / EMBEDDED_LEDGER_FILE).exists()
    assert read_all(kafka.bootstrap_servers, output) == []


@pytest.mark.parametrize("ledger", ["shared file", "postgresql"])
def test_two_workers_sharing_one_ledger_commit_every_record_once(kafka, spark_connect, topics, pipeline, tmp_path,
                                                                 unique, ledger, request):
    source, output = topics
    # The writes run on the session's warm Spark Connect server (as the system tests' protocol tests do): a Spark
    # driver per write task would add 15 to 20 s each, and where Spark runs is not what is tested here.
    warm_spark = {f"AIRFLOW_CONN_{SPARK_CONN_ID.upper()}": json.dumps(spark_connect.connection())}
    pipeline = {**pipeline, "spark_conn_id": SPARK_CONN_ID}
    if ledger == "shared file":
        # Each worker's AIRFLOW_HOME holds the same file (as a volume both mount there), and the deployment says so.
        a, b = workers(kafka, tmp_path, **warm_spark, **{SHARED: "True"})
        shared = tmp_path / "shared" / EMBEDDED_LEDGER_FILE
        shared.parent.mkdir()
        for worker in (a, b):
            (worker.home / EMBEDDED_LEDGER_FILE).symlink_to(shared)
        url = f"sqlite:///{shared}"
    else:
        postgres = request.getfixturevalue("postgres")
        database = f"two_workers_{unique}"
        url = postgres.create_database(database)
        a, b = workers(kafka, tmp_path, **warm_spark, **{f"AIRFLOW_CONN_{LEDGER_CONN_ID.upper()}": json.dumps({
            "conn_type": "postgres", "host": "127.0.0.1", "port": postgres.port, "login": "postgres",
            "schema": database})})
        pipeline = {**pipeline, "ledger_conn_id": LEDGER_CONN_ID}
    sent = produce(kafka.bootstrap_servers, source, RECORDS)
    first = a.run(pipeline, "manual__1")  # run 1 on worker A: plan, write, notify_complete
    assert first.get("error") is None, first
    assert not [w for w in first["parse_warnings"] if w.startswith("EmbeddedLedgerWarning")]
    assert first["batch_id"] == f"{pipeline['pipeline_id']}:1"
    sent += produce(kafka.bootstrap_servers, source, RECORDS, start=RECORDS)
    if ledger == "shared file":
        # Run 2: planned and written on worker B, committed on worker A (Celery hands each task to any worker).
        second = b.run(pipeline, "manual__2", steps=("plan", "write"))
        assert second.get("error") is None, second
        committed = a.run(pipeline, "manual__2", steps=("notify_complete",), batch_id=second["batch_id"])
        assert committed.get("error") is None, committed
    else:  # run 2 on worker B, as in the issue
        second = b.run(pipeline, "manual__2")
        assert second.get("error") is None, second
    assert second["batch_id"] == f"{pipeline['pipeline_id']}:2"  # B continued the pipeline: it did not start again
    assert_exactly_once(sent, read_all(kafka.bootstrap_servers, output))
    book = Ledger(url)
    batches = book.list_batches(pipeline["pipeline_id"], newest_first=False)
    assert [(batch.seq, batch.state, batch.run_id) for batch in batches] == [(1, BatchState.COMMITTED, "manual__1"),
                                                                               (2, BatchState.COMMITTED, "manual__2")]
    assert sum(batch.input_records for batch in batches) == 2 * RECORDS
    assert_ranges_tile(book, pipeline["pipeline_id"])  # batch 2 starts where batch 1 ended
    if ledger == "postgresql":  # and no worker made a file of its own
        assert not (a.home / EMBEDDED_LEDGER_FILE).exists() and not (b.home / EMBEDDED_LEDGER_FILE).exists()
