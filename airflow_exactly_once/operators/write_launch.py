"""Where the write runs (docs/cluster.md), chosen in one place from the write task's settings.

In the task (spark.launch.in_task), on a Spark Connect server (spark.launch.connect), or spark-submitted to
a cluster (spark.launch.submit): `write_launcher` returns one of them, behind the interface of
spark.launch.launcher. A write on a Spark Connect server can outlive its task, so the protocol is also
told how to stop such attempts (`attempts_stopper`).

Which Spark runs the write also decides which Spark line the sink's JVM libraries must exist for: the installed
pyspark's in the task and for spark-submit (spark.packages fills in their coordinates from it), the server's on
Spark Connect (checked by the write, on its session). `check_packages_at_parse` and `check_write_packages` refuse
a line without a build (Iceberg's runtime on Spark 4.2) before a batch is planned.

Each launcher is imported in its own branch: Airflow imports this module with the DAG in every task of
the pipeline, and a task loads only the Spark client its write runs (the plan and notify_complete tasks
none, a Spark Connect write not the in-task driver's modules).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.declaration import is_template
from airflow_exactly_once.core.protocol import BatchCoordinator, StopAttempts
from airflow_exactly_once.core.task_log import TaskLog
from airflow_exactly_once.sinks import spec_line_packages
from airflow_exactly_once.spark.launch.launcher import WriteLauncher
from airflow_exactly_once.spark.packages import check_line_packages, pipeline_packages


def write_launcher(coordinator: Callable[[], BatchCoordinator], *, spark_conn_id: str | None,
                   connect_url: str | None, spark_conf: dict[str, Any] | None, transform: str | Callable | None,
                   log: TaskLog, connect_session: str = "pipeline") -> WriteLauncher:
    """The launcher of the write: on the Spark Connect server at `connect_url` (a `spark_connect` connection, or
    spark_conf's spark.remote), spark-submitted with the `spark` connection `spark_conn_id`, else in the task.

    `coordinator` builds the batch's coordinator (it opens the ledger): called only after what can be refused
    without it was refused.
    """
    if connect_url is not None:
        from airflow_exactly_once.spark.launch.connect import ConnectWrite

        return ConnectWrite(coordinator(), connect_url, transform, log, share_session=connect_session == "pipeline")
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


def check_packages_at_parse(sink: Any, dead_letter: Any, bad_record_policy: Any, spark_conn_id: Any,
                            spark_conf: Any) -> None:
    """When a DAG is parsed: a library the sink needs with no build for the installed pyspark's line is a
    ConfigurationError, if the write runs in the task (no spark_conn_id, whose type is known only when the task
    looks the connection up; no spark.remote) and nothing it depends on is a template (checked at plan time)."""
    if spark_conn_id or not isinstance(spark_conf, (dict, type(None))):
        return
    conf = spark_conf or {}
    if "spark.remote" in conf or any(is_template(v) for v in conf.values()):
        return
    packages = [*spec_line_packages(sink), *(spec_line_packages(dead_letter, "dead_letter")
                                             if bad_record_policy == "dead_letter" else ())]
    check_line_packages(conf, packages)


def check_write_packages(config: PipelineConfig, *, connect_url: str | None,
                         spark_conf: dict[str, Any] | None) -> None:
    """Before a batch is planned: what the write would refuse before starting Spark, a library the sink needs with no
    build for the installed pyspark's line (in the task, or spark-submitted). A Spark Connect server's Spark is not
    the installed pyspark: the write checks it on its session."""
    if connect_url is None:
        check_line_packages(spark_conf or {}, pipeline_packages(config))
