"""Issue 47: a sink folder that is a local path, where the pipeline's tasks may run on several machines.

Not an error (a folder every worker mounts at the same path is a valid setup, and nothing tells it from a local
disk): a warning when the DAG is parsed and a line in the task's log, naming the executor and what to use instead.
Airflow's configuration is set through its AIRFLOW__SECTION__OPTION variables, as a deployment sets it.
"""

from __future__ import annotations

import logging
import warnings

import pytest

from airflow_exactly_once.airflow_integration.placement import (LocalFolderWarning, local_folder_problems,
                                                                 several_machines)
from airflow_exactly_once.operators.batch import PlanBatchOperator, WriteBatchOperator
from airflow_exactly_once.sinks import spec_local_folders

CELERY = "CeleryExecutor"


@pytest.fixture
def celery(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", CELERY)


def args(tmp_path, sink: dict, **more) -> dict:
    """A pipeline on a ledger of its own (not the embedded one, which has its own verdict)."""
    return dict(pipeline_id="p", topics="t", bootstrap_servers="127.0.0.1:9", sink=sink,
                ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}", **more)


def parquet(tmp_path) -> dict:
    return {"type": "parquet", "path": str(tmp_path / "out")}


def test_the_shared_executor_verdict_is_the_ledgers(celery, monkeypatch):
    assert str(several_machines()) == "executor CeleryExecutor ([core] executor = 'CeleryExecutor')"
    assert str(several_machines("KubernetesExecutor")) == \
        "executor KubernetesExecutor (the task's executor='KubernetesExecutor')"
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    assert several_machines() is None


def test_parsing_warns_of_a_local_parquet_path_naming_the_executor_and_the_way_out(celery, tmp_path):
    with pytest.warns(LocalFolderWarning) as caught:
        PlanBatchOperator(task_id="plan", **args(tmp_path, parquet(tmp_path)))
    message = str(caught[0].message)
    assert message.startswith(f"pipeline p: sink path {str(tmp_path / 'out')!r} is a local path, and executor "
                              "CeleryExecutor ([core] executor = 'CeleryExecutor') may run the pipeline's tasks on "
                              "several machines")
    assert "a task on another worker cannot see the files an earlier task left there" in message
    assert "a folder every worker mounts at the same path" in message


@pytest.mark.parametrize("warehouse, warned", [
    ("/data/lake", True), ("file:///data/lake", True), ("s3://bucket/lake", False), ("{{ var.value.lake }}", False)])
def test_an_iceberg_warehouse_is_warned_of_when_local_only(celery, tmp_path, warehouse, warned):
    sink = {"type": "iceberg", "table": "db.events", "warehouse": warehouse,
            "catalog": {"type": "postgres", "conn_id": "catalog"}}
    problems = local_folder_problems(spec_local_folders(sink))
    assert bool(problems) is warned
    if warned:
        assert problems[0].startswith(f"sink warehouse {warehouse!r} is a local path")
        assert "object storage (warehouse 's3://...'" in problems[0]


def test_a_dead_letter_folder_is_looked_at_too(celery, tmp_path):
    write = WriteBatchOperator(task_id="write", batch_id="p:1", **args(
        tmp_path, {"type": "kafka", "topic": "out"}, bad_record_policy="dead_letter",
        dead_letter={"type": "parquet", "path": "/var/dead"}))
    problems = write.local_folder_problems()
    assert len(problems) == 1 and problems[0].startswith("dead_letter path '/var/dead' is a local path")


def test_no_warning_where_the_tasks_stay_on_one_machine_unless_the_task_goes_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor,CeleryExecutor")
    with warnings.catch_warnings():
        warnings.simplefilter("error", LocalFolderWarning)
        PlanBatchOperator(task_id="plan", **args(tmp_path, parquet(tmp_path)))
    with pytest.warns(LocalFolderWarning, match="the task's executor='CeleryExecutor'"):
        WriteBatchOperator(task_id="write", batch_id="p:1", executor=CELERY, **args(tmp_path, parquet(tmp_path)))


def test_the_task_logs_it_and_goes_on(celery, tmp_path, monkeypatch, caplog):
    with pytest.warns(LocalFolderWarning):
        task = PlanBatchOperator(task_id="plan", **args(tmp_path, parquet(tmp_path)))
    monkeypatch.setattr(PlanBatchOperator, "run_step", lambda self, context: "planned")
    monkeypatch.setattr(task, "_cached_logger", logging.getLogger("task"))  # the task log, where caplog reads it
    with caplog.at_level(logging.WARNING):
        assert task.execute({"run_id": "manual__1"}) == "planned"  # a warning, not a failure
    assert any("is a local path, and executor CeleryExecutor" in record.getMessage() for record in caplog.records)
