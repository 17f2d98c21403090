"""Reads the write/notify_complete retry settings off the DAG for the transaction timeout guardrail.

The rule itself is pure and lives in airflow_exactly_once.core.txn_budget; this module only
finds the pipeline's write and notify_complete tasks downstream of `plan` and turns their
Airflow settings into numbers.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from airflow_exactly_once.core.sink import Sink
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


def _nearest_downstream(task: Any, cls: type) -> Any | None:
    """The closest task of type `cls` after `task` (breadth first), so each task group finds its own."""
    seen, level = set(), list(task.downstream_list)
    while level:
        for candidate in level:
            if isinstance(candidate, cls):
                return candidate
        seen.update(t.task_id for t in level)
        level = [t for c in level for t in c.downstream_list if t.task_id not in seen]
    return None


def check_commit_deadline(plan_task: Any, sink: Sink, log: logging.Logger) -> None:
    """Fail `plan` when the sink's pre-committed output can expire before notify_complete's last retry."""
    from airflow_exactly_once.operators.batch import NotifyCompleteOperator, WriteBatchOperator

    deadline_ms = sink.commit_deadline_ms()
    if deadline_ms is None:
        return
    write = _nearest_downstream(plan_task, WriteBatchOperator)
    notify = _nearest_downstream(plan_task, NotifyCompleteOperator)
    for warning in check_transaction_timeout(deadline_ms, write and retry_budget(write),
                                             notify and retry_budget(notify)):
        log.warning("transaction timeout check: %s", warning)
