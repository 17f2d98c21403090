"""The write spark-submitted to a cluster: checks in the task, then spark-submit, then the ledger's verdict.

The job (spark.write_job) claims, writes and marks the batch PREPARED by itself; this side only
prepares the submission and afterwards trusts the ledger, not spark-submit's exit code: a job
killed after it marked the batch PREPARED has done its work, and one that reported an error
fails the task the same way the in-process write would. The submission goes through the
Spark provider's hook (hooks.spark_submit), which operators.write_launch hands in: it is an
optional extra, and this module stays free of Airflow.
"""

from __future__ import annotations

from typing import Any, Callable

from airflow_exactly_once.core.config import resolve_transform
from airflow_exactly_once.core.errors import ConfigurationError, FencedError
from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.task_log import TaskLog
from airflow_exactly_once.core.write_report import clear_failure, recorded_failure
from airflow_exactly_once.spark.launch.launcher import WriteLauncher
from airflow_exactly_once.spark.packages import pipeline_packages
from airflow_exactly_once.spark.write_report import WriteReport, skipped


class SparkSubmitWrite(WriteLauncher):
    """`start` checks what it can and prepares the submission, `wait` spark-submits the job and reads the ledger;
    `cancel` is the hook's on_kill (spark-submit and its driver stop)."""

    def __init__(self, coordinator: BatchCoordinator, spark_conn_id: str, spark_conf: dict[str, Any] | None,
                 transform: str | Callable | None, log: TaskLog, submit_hook: Callable[..., Any]) -> None:
        self.coordinator = coordinator
        self.spark_conn_id = spark_conn_id
        self.spark_conf = spark_conf
        self.transform = transform
        self.log = log
        self.submit_hook = submit_hook  # hooks.spark_submit.WriteJobSubmitHook
        self.hook: Any = None  # the Spark provider's SparkSubmitHook (this module stays free of Airflow)
        self.report: WriteReport | None = None  # known before any submission: the batch is past the write

    @staticmethod
    def check_transform(transform: str | Callable | None, spark_conn_id: str) -> None:
        """Before anything runs: a spark-submit job can only import its transform by name."""
        if transform is not None and not isinstance(transform, str):
            raise ConfigurationError(
                f"transform {getattr(transform, '__name__', transform)!r} is a Python callable, but with "
                f"spark_conn_id={spark_conn_id!r} the write runs in a spark-submit process that cannot "
                "receive one: move the function into a module (the DAG folder will do) and pass "
                "transform='module:function'")

    def start(self, batch_id: BatchId) -> None:
        self.batch_id = batch_id
        config, ledger = self.coordinator.config, self.coordinator.ledger
        past = self.coordinator.past_write(batch_id)  # the protocol's check, before a Spark application starts
        if past is not None:
            self.report = skipped(batch_id, past, "submit")
            return
        resolve_transform(config.transform)  # a typo fails here, before a Spark application starts
        stored = config.to_stored_dict()
        ledger.ensure_pipeline(config.pipeline_id, config.fingerprint(), stored)
        ledger.store_config(config.pipeline_id, stored)
        clear_failure(ledger, batch_id)
        self.hook = self.submit_hook(spark_conn_id=self.spark_conn_id, batch_id=batch_id, ledger_url=ledger.url,
                                     transform=config.transform, spark_conf=self.spark_conf, config=config,
                                     packages=pipeline_packages(config))

    def wait(self) -> WriteReport:
        if self.report is not None:
            return self.report
        batch_id, ledger = self.batch_id, self.coordinator.ledger
        try:
            self.hook.submit_write()
        except Exception as exc:  # the hook's AirflowException: spark-submit failed, or was stopped
            reported = recorded_failure(ledger, batch_id)
            if reported is not None:
                raise reported from exc
            if ledger.get_batch(batch_id).state is not BatchState.PREPARED:
                raise
            self.log.warning("spark-submit failed (%s) after the job had marked batch %s PREPARED; the write is "
                             "complete", exc, batch_id)
        finally:
            self.hook = None
        done = ledger.get_batch(batch_id)
        if done.state not in (BatchState.PREPARED, BatchState.COMMITTED):  # COMMITTED: another run's recovery
            reported = recorded_failure(ledger, batch_id)
            raise reported or FencedError(
                f"the Spark job ended but batch {batch_id} is {done.state.value}, not PREPARED", retriable=True)
        if done.state is BatchState.COMMITTED:
            self.log.info("batch %s was committed meanwhile by another run's recovery", batch_id)
        return {"batch": str(batch_id), "action": "prepared", "state": done.state.value,
                "input_records": done.input_records, "output_records": done.output_records,
                "attempt": f"e{done.epoch}", "spark_conn_id": self.spark_conn_id}

    def cancel(self) -> None:
        if self.hook is not None:
            self.hook.on_kill()
