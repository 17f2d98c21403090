"""Issue 47: every task attempt as a Kubernetes pod runs it: a process of its own on a machine of its own, with an
empty AIRFLOW_HOME, working directory, HOME and TMPDIR, all deleted when it ends.

So no task can read anything local that an earlier task (or an earlier attempt of itself) wrote: whatever it needs
must come from the ledger (PostgreSQL), the sink (Kafka transactions) and XCom (the batch id, handed on here as the
task group hands it). tests/worker_tasks.py runs the task; the write's first attempt is SIGKILLed at the named fault
point `write.after_stage` (its Kafka transactions open), and its retry, in a fresh pod, must end them; the output is
exact, nothing is left open, the ledger tiles, and the next batch's plan, in a pod that never saw the pipeline,
continues where the first batch ended.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from airflow_exactly_once.core.faults import ENV as FAULTS_ENV
from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.hooks.ledger import EMBEDDED_LEDGER_FILE
from tests.helpers import assert_exactly_once, assert_ranges_tile, create_topic, produce
from tests.kafka_helpers import read_all

REPO = Path(__file__).resolve().parents[2]
RECORDS = 90  # per batch
LEDGER_CONN_ID = "eo_pods_ledger"
SPARK_CONN_ID = "eo_pods_spark"


class Pods:
    """Runs one task attempt per pod: a fresh folder (AIRFLOW_HOME, working directory, HOME, TMPDIR) that is
    deleted once the attempt ended, whatever it left there. `left` records what each attempt left behind."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env, self.count = root, env, 0
        self.left: dict[str, list[str]] = {}

    def run(self, pipeline: dict[str, Any], run_id: str, step: str, batch_id: str | None = None) -> dict[str, Any]:
        """Task `step` of run `run_id` in a new pod; what it returned, or {"killed": True} for a SIGKILLed attempt."""
        self.count += 1
        pod = self.root / f"pod-{self.count}-{step}"
        home, work, tmp = pod / "airflow-home", pod / "work", pod / "tmp"
        for folder in (home, work, tmp):
            folder.mkdir(parents=True)
        request = {"dag_id": pipeline["pipeline_id"], "pipeline": pipeline, "run_id": run_id, "steps": [step],
                   "batch_id": batch_id}
        env = {**self.env, "AIRFLOW_HOME": str(home), "HOME": str(pod), "TMPDIR": str(tmp)}
        done = subprocess.run([sys.executable, "-m", "tests.worker_tasks", json.dumps(request)], cwd=work, env=env,
                              capture_output=True, text=True, timeout=600)
        self.left[pod.name] = sorted(str(p.relative_to(pod)) for p in pod.rglob("*") if p.is_file())
        shutil.rmtree(pod)  # the pod is gone: nothing of it survives for the next task
        if done.returncode == -signal.SIGKILL:
            return {"killed": True}
        assert done.returncode == 0, done.stderr[-4000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report.get("error") is None, report
        return report


def test_each_task_attempt_in_its_own_empty_home_commits_every_record_once(kafka, postgres, spark_connect, tmp_path,
                                                                            unique):
    source, output = f"pods-in-{unique}", f"pods-out-{unique}"
    for topic in (source, output):
        create_topic(kafka.bootstrap_servers, topic, partitions=3)
    database = f"pods_{unique}"
    ledger_url = postgres.create_database(database)
    faults = tmp_path / "faults"
    env = {key: value for key, value in os.environ.items() if key != "AIRFLOW_HOME"}
    env.update({
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        "AIRFLOW__CORE__EXECUTOR": "KubernetesExecutor", "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka",
                                                  "extra": {"bootstrap.servers": kafka.bootstrap_servers}}),
        f"AIRFLOW_CONN_{LEDGER_CONN_ID.upper()}": json.dumps({
            "conn_type": "postgres", "host": "127.0.0.1", "port": postgres.port, "login": "postgres",
            "schema": database}),
        f"AIRFLOW_CONN_{SPARK_CONN_ID.upper()}": json.dumps(spark_connect.connection()),
        FAULTS_ENV: str(faults),
    })
    pipeline = {"pipeline_id": f"pods_{unique}", "topics": source, "sink": {"type": "kafka", "topic": output},
                "startup_mode": "earliest", "ledger_conn_id": LEDGER_CONN_ID, "spark_conn_id": SPARK_CONN_ID}
    pods = Pods(tmp_path / "pods", env)
    sent = produce(kafka.bootstrap_servers, source, RECORDS)
    batch_id = pods.run(pipeline, "manual__1", "plan")["batch_id"]
    arm(faults, "write.after_stage", "kill")  # the first write dies with its Kafka transactions open
    assert pods.run(pipeline, "manual__1", "write", batch_id) == {"killed": True}
    pods.run(pipeline, "manual__1", "write", batch_id)  # its retry, in another pod
    pods.run(pipeline, "manual__1", "notify_complete", batch_id)
    produce(kafka.bootstrap_servers, source, RECORDS, start=RECORDS)
    second = pods.run(pipeline, "manual__2", "plan")["batch_id"]  # a pod that never saw the pipeline

    assert "write.after_stage kill" in (faults / "fired.log").read_text()
    assert len(pods.left) == 5
    # No pod kept a ledger of its own (they all used the PostgreSQL one).
    assert not [pod for pod, files in pods.left.items() if f"airflow-home/{EMBEDDED_LEDGER_FILE}" in files]
    assert_exactly_once(sent, read_all(kafka.bootstrap_servers, output))  # settled: no transaction left open
    assert len(read_all(kafka.bootstrap_servers, output, "read_uncommitted")) == 2 * RECORDS  # the killed copy too
    ledger = Ledger(ledger_url)
    first, planned = ledger.list_batches(pipeline["pipeline_id"], newest_first=False)
    assert (batch_id, second) == (f"{pipeline['pipeline_id']}:1", f"{pipeline['pipeline_id']}:2")
    assert (first.state, first.input_records) == (BatchState.COMMITTED, RECORDS)
    assert_ranges_tile(ledger, pipeline["pipeline_id"])
    # The second plan continued where the first batch ended: it read the ledger, not a local file of its own.
    assert planned.state is BatchState.PLANNED
    assert {(r.topic, r.partition): r.start for r in planned.ranges} == {
        (r.topic, r.partition): r.end for r in first.ranges}
    assert sum(r.end - r.start for r in planned.ranges) == RECORDS
