"""One call that adds a whole exactly-once micro-batch to a DAG."""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.airflow_integration.assets import batches_alias
from airflow_exactly_once.airflow_integration.compat import TaskGroup
from airflow_exactly_once.operators.batch import (
    AbortBatchOperator,
    NotifyCompleteOperator,
    PlanBatchOperator,
    WriteBatchOperator,
)

__all__ = ["exactly_once_batch"]


def exactly_once_batch(group_id: str = "exactly_once", **pipeline: Any) -> TaskGroup:
    """`plan >> write >> notify_complete`, and `abort` when plan or write fail for good.

    `abort` hangs off `write` only, so that `notify_complete` stays a leaf: a failed batch
    then fails the DAG run even though `abort` succeeded. A failed notify_complete needs no
    abort (the batch is PREPARED; the next run's recovery commits it).

    `pipeline` takes the arguments of ExactlyOnceBaseOperator (pipeline_id, topics, sink,
    transform, ...) plus per-task Airflow arguments given as `plan_kwargs`, `write_kwargs`,
    `notify_kwargs` and `abort_kwargs` (for example different retries).
    """
    per_task = {name: dict(pipeline.pop(f"{name}_kwargs", {})) for name in ("plan", "write", "notify", "abort")}
    for name in ("plan", "notify"):  # the tasks that commit batches announce them as Asset events
        per_task[name].setdefault("outlets", [batches_alias()])
    with TaskGroup(group_id=group_id) as group:
        # plan checks the transaction timeout against the retry settings of these two tasks.
        plan = PlanBatchOperator(task_id="plan", write_task_id=group.child_id("write"),
                                 notify_task_id=group.child_id("notify_complete"), **pipeline, **per_task["plan"])
        batch_id = "{{ ti.xcom_pull(task_ids='%s') }}" % plan.task_id
        write = WriteBatchOperator(task_id="write", batch_id=batch_id, **pipeline, **per_task["write"])
        notify = NotifyCompleteOperator(task_id="notify_complete", batch_id=batch_id, **pipeline,
                                        **per_task["notify"])
        abort = AbortBatchOperator(task_id="abort", batch_id=batch_id, trigger_rule="one_failed",
                                   **pipeline, **per_task["abort"])
        plan >> write >> notify
        write >> abort
    return group
