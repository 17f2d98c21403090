"""A pipeline's tasks as one Airflow worker runs them: in a process of their own, under that process's AIRFLOW_HOME
and Airflow configuration (tests/integration/test_ledger_on_two_workers.py starts one process per worker and run).

    python -m tests.worker_tasks '{"dag_id": "...", "pipeline": {<operator arguments>}, "run_id": "...",
                                   "steps": ["plan", "write", "notify_complete"]}'

The DAG is built here, as a worker parses the DAG file (the operators' parse-time checks run), then each step's
`execute` runs, write and notify_complete with the batch id plan returned, as the task group's XCom hands it on.
It prints one JSON line: the warnings the DAG gave when parsed, each step's result, or the error that ended the run.
"""

from __future__ import annotations

import json
import sys
import warnings
from datetime import datetime
from typing import Any

STEPS = ("plan", "write", "notify_complete")  # a whole run, in order ("abort" may also be asked for)


def run(request: dict[str, Any]) -> dict[str, Any]:
    from airflow.sdk import DAG

    from airflow_exactly_once.airflow_integration.compat import AirflowSkipException
    from airflow_exactly_once.operators.batch import (
        AbortBatchOperator,
        NotifyCompleteOperator,
        PlanBatchOperator,
        WriteBatchOperator,
    )

    with warnings.catch_warnings(record=True) as parsed:
        warnings.simplefilter("always")
        with DAG(request["dag_id"], schedule=None, start_date=datetime(2024, 1, 1)):
            tasks = {"plan": PlanBatchOperator(task_id="plan", **request["pipeline"]),
                     "write": WriteBatchOperator(task_id="write", **request["pipeline"]),
                     "notify_complete": NotifyCompleteOperator(task_id="notify_complete", **request["pipeline"]),
                     "abort": AbortBatchOperator(task_id="abort", **request["pipeline"])}
    report: dict[str, Any] = {"parse_warnings": [f"{w.category.__name__}: {w.message}" for w in parsed], "steps": {}}
    batch_id = request.get("batch_id")
    for step in request["steps"]:
        task = tasks[step]
        if step != "plan":
            task.batch_id = batch_id
        try:
            result = task.execute({"run_id": request["run_id"]})
        except AirflowSkipException as exc:
            report["steps"][step] = {"skipped": str(exc)}
            break
        except Exception as exc:  # noqa: BLE001 - the test reads which error ended the run
            report["error"] = {"step": step, "type": type(exc).__name__, "message": str(exc)}
            break
        report["steps"][step] = result
        if step == "plan":
            batch_id = result
    report["batch_id"] = batch_id
    return report


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1])), default=str))
