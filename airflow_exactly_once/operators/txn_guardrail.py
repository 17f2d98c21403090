"""Reads the write/notify_complete retry settings off the DAG for the transaction timeout guardrail.

The rule itself is pure and lives in airflow_exactly_once.core.txn_budget; this module only
looks up the pipeline's write and notify_complete tasks (the task group names them to plan)
and turns their Airflow settings into numbers.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.core.task_log import TaskLog
from airflow_exactly_once.core.txn_budget import RetryBudget, check_transaction_timeout


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def retry_budget(task: Any) -> RetryBudget:
    return RetryBudget(
        task_id=task.task_id,
        retries=int(task.retries or 0),
        retry_delay_s=_seconds(task.retry_delay) or 0.0,
        execution_timeout_s=_seconds(task.execution_timeout),
        exponential_backoff=bool(task.retry_exponential_backoff),
        max_retry_delay_s=_seconds(task.max_retry_delay),
    )


def _task(plan_task: Any, task_id: str | None) -> Any | None:
    """The task `task_id` of plan's DAG (None if not given or not there)."""
    dag = getattr(plan_task, "dag", None)
    if task_id is None or dag is None or not dag.has_task(task_id):
        return None
    return dag.get_task(task_id)


def check_commit_deadline(plan_task: Any, sink: SinkCommitter, write_task_id: str | None, notify_task_id: str | None,
                          log: TaskLog) -> None:
    """Fail `plan` when the sink's pre-committed output can expire before notify_complete's last retry.

    The task group tells plan which tasks are its write and notify_complete (`write_task_id`,
    `notify_task_id`); without them the check warns that it could not read their settings.
    """
    deadline_ms = sink.commit_deadline_ms()
    if deadline_ms is None:
        return
    write, notify = _task(plan_task, write_task_id), _task(plan_task, notify_task_id)
    for warning in check_transaction_timeout(deadline_ms, write and retry_budget(write),
                                             notify and retry_budget(notify)):
        log.warning("transaction timeout check: %s", warning)
