"""The write step on a Spark cluster: checks in the task, then spark-submit, then the ledger's verdict.

The job claims, writes and marks the batch PREPARED by itself; this side only prepares the
submission and afterwards trusts the ledger, not spark-submit's exit code: a job killed
after it marked the batch PREPARED has done its work, and one that reported an error
fails the task the same way the in-process write would.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from airflow_exactly_once.compat import AirflowException
from airflow_exactly_once.core.config import resolve_transform
from airflow_exactly_once.core.errors import ConfigurationError, FencedError
from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.write_report import clear_failure, recorded_failure
from airflow_exactly_once.spark.connector import pipeline_packages


class ClusterWrite:
    """One spark-submit of the write job, owned by the write task (which calls `kill` from on_kill)."""

    def __init__(self, coordinator: BatchCoordinator, ledger_url: str, spark_conn_id: str,
                 spark_conf: dict[str, Any] | None, transform: str | Callable | None, log: logging.Logger) -> None:
        self.coordinator = coordinator
        self.ledger_url = ledger_url
        self.spark_conn_id = spark_conn_id
        self.spark_conf = spark_conf
        self.transform = transform
        self.log = log
        self.hook = None

    @staticmethod
    def check_transform(transform: str | Callable | None, spark_conn_id: str) -> None:
        """Before anything runs: a spark-submit job can only import its transform by name."""
        if transform is not None and not isinstance(transform, str):
            raise ConfigurationError(
                f"transform {getattr(transform, '__name__', transform)!r} is a Python callable, but with "
                f"spark_conn_id={spark_conn_id!r} the write runs in a spark-submit process that cannot "
                "receive one: move the function into a module (the DAG folder will do) and pass "
                "transform='module:function'")

    def run(self, batch_id: BatchId) -> dict[str, Any]:
        config, ledger = self.coordinator.config, self.coordinator.ledger
        batch = ledger.get_batch(batch_id)
        if batch.state in (BatchState.PREPARED, BatchState.COMMITTED):
            return {"batch": str(batch_id), "action": "skipped", "state": batch.state.value,
                    "message": f"batch {batch_id} is already {batch.state.value}; nothing to submit"}
        if batch.state is BatchState.ABORTED:
            raise FencedError(f"batch {batch_id} was aborted ({batch.error}); this run cannot write it")
        resolve_transform(config.transform)  # a typo fails here, before a Spark application starts
        ledger.ensure_pipeline(config.pipeline_id, config.fingerprint(), config.to_stored_dict())
        ledger.store_config(config.pipeline_id, config.to_stored_dict())
        clear_failure(ledger, batch_id)
        self.hook = _submit_hook_class()(spark_conn_id=self.spark_conn_id, batch_id=batch_id,
                                         ledger_url=self.ledger_url, transform=config.transform,
                                         spark_conf=self.spark_conf, secrets=config.secrets(),
                                         packages=pipeline_packages(config, self.coordinator.sink))
        try:
            self.hook.submit_write()
        except AirflowException as exc:
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

    def kill(self) -> None:
        if self.hook is not None:
            self.hook.on_kill()


def _submit_hook_class() -> type:
    """The spark-submit hook. Imported here, not at the top: the Spark provider is the optional
    [spark-submit] extra, and without it the import raises MissingExtraError (naming the extra)."""
    from airflow_exactly_once.hooks.spark_submit import WriteJobSubmitHook

    return WriteJobSubmitHook
