"""Where the write runs (docs/cluster.md), chosen in one place from the write task's settings.

In the task (spark.launch.in_task), on a Spark Connect server (spark.launch.connect), or spark-submitted to
a cluster (spark.launch.submit): `write_launcher` returns one of them, behind the interface of
spark.launch.launcher. A write on a Spark Connect server can outlive its task, so the protocol is also
told how to stop such attempts (`attempts_stopper`).

Each launcher is imported in its own branch: Airflow imports this module with the DAG in every task of
the pipeline, and a task loads only the Spark client its write runs (the plan and notify_complete tasks
none, a Spark Connect write not the in-task driver's modules).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from airflow_exactly_once.core.protocol import BatchCoordinator, StopAttempts
from airflow_exactly_once.core.task_log import TaskLog
from airflow_exactly_once.spark.launch.launcher import WriteLauncher


def write_launcher(coordinator: Callable[[], BatchCoordinator], *, spark_conn_id: str | None,
                   connect_url: str | None, spark_conf: dict[str, Any] | None, transform: str | Callable | None,
                   log: TaskLog) -> WriteLauncher:
    """The launcher of the write: on the Spark Connect server at `connect_url` (a `spark_connect` connection, or
    spark_conf's spark.remote), spark-submitted with the `spark` connection `spark_conn_id`, else in the task.

    `coordinator` builds the batch's coordinator (it opens the ledger): called only after what can be refused
    without it was refused.
    """
    if connect_url is not None:
        from airflow_exactly_once.spark.launch.connect import ConnectWrite

        return ConnectWrite(coordinator(), connect_url, transform, log)
    if spark_conn_id:
        from airflow_exactly_once.spark.launch.submit import SparkSubmitWrite

        SparkSubmitWrite.check_transform(transform, spark_conn_id)
        return SparkSubmitWrite(coordinator(), spark_conn_id, spark_conf, transform, log, _submit_hook_class())
    from airflow_exactly_once.spark.launch.in_task import InTaskWrite

    return InTaskWrite(coordinator(), spark_conf, transform)


def attempts_stopper(connect_url: str | None) -> StopAttempts | None:
    """How abort and recovery stop the write attempts of a batch that may still run: on a Spark Connect server only.
    In the task its JVM dies with it; spark-submitted, its driver does (die_with_parent) or is fenced."""
    if connect_url is None:
        return None
    from airflow_exactly_once.spark.connect_server.stop import stop_batch_attempts

    return partial(stop_batch_attempts, connect_url)


def _submit_hook_class() -> type:
    """The spark-submit hook. Imported here, not at the top: the Spark provider is the optional
    [spark-submit] extra, and without it the import raises MissingExtraError (naming the extra)."""
    from airflow_exactly_once.hooks.spark_submit import WriteJobSubmitHook

    return WriteJobSubmitHook
