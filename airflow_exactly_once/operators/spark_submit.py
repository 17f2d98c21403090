"""The write step on a Spark cluster: checks in the task, then spark-submit, then the ledger's verdict.

The job claims, writes and marks the batch PREPARED by itself; this side only prepares the
submission and afterwards trusts the ledger, not spark-submit's exit code: a job killed
after it marked the batch PREPARED has done its work, and one that reported an error
fails the task the same way the in-process write would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_exactly_once.compat import AirflowException
from airflow_exactly_once.core.config import resolve_transform
from airflow_exactly_once.core.errors import ConfigurationError, FencedError
from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.write_report import clear_failure, recorded_failure
from airflow_exactly_once.hooks.ledger import LedgerHook

if TYPE_CHECKING:
    from airflow_exactly_once.operators.batch import WriteBatchOperator


def write_on_cluster(operator: "WriteBatchOperator", batch_id: BatchId) -> dict[str, Any]:
    # Here, not at the top: the Spark provider is the optional [spark-submit] extra, and without it
    # this import raises MissingExtraError (not retriable: the task fails at once, naming the extra).
    from airflow_exactly_once.hooks.spark_submit import WriteJobSubmitHook

    if operator.transform is not None and not isinstance(operator.transform, str):
        raise ConfigurationError(
            f"transform {getattr(operator.transform, '__name__', operator.transform)!r} is a Python callable, but "
            f"with spark_conn_id={operator.spark_conn_id!r} the write runs in a spark-submit process that cannot "
            "receive one: move the function into a module (the DAG folder will do) and pass "
            "transform='module:function'")
    coordinator = operator.coordinator()
    config, ledger = coordinator.config, coordinator.ledger
    batch = ledger.get_batch(batch_id)
    if batch.state in (BatchState.PREPARED, BatchState.COMMITTED):
        return {"batch": str(batch_id), "action": "skipped", "state": batch.state.value,
                "message": f"batch {batch_id} is already {batch.state.value}; nothing to submit"}
    if batch.state is BatchState.ABORTED:
        raise FencedError(f"batch {batch_id} was aborted ({batch.error}); this run cannot write it")
    resolve_transform(config.transform)  # a typo fails here, before a Spark application starts
    ledger.ensure_pipeline(config.pipeline_id, config.fingerprint(), config.to_dict())
    ledger.store_config(config.pipeline_id, config.to_dict())
    clear_failure(ledger, batch_id)

    hook = WriteJobSubmitHook(spark_conn_id=operator.spark_conn_id, batch_id=batch_id,
                              ledger_url=LedgerHook(ledger_conn_id=operator.ledger_conn_id, ledger_url=operator.ledger_url).get_url(), transform=config.transform,
                              spark_conf=operator.spark_conf)
    operator.submit_hook = hook
    try:
        hook.submit_write()
    except AirflowException as exc:
        reported = recorded_failure(ledger, batch_id)
        if reported is not None:
            raise reported from exc
        if ledger.get_batch(batch_id).state is not BatchState.PREPARED:
            raise
        operator.log.warning("spark-submit failed (%s) after the job had marked batch %s PREPARED; the write is "
                             "complete", exc, batch_id)
    finally:
        operator.submit_hook = None
    done = ledger.get_batch(batch_id)
    if done.state not in (BatchState.PREPARED, BatchState.COMMITTED):  # COMMITTED: another run's recovery
        reported = recorded_failure(ledger, batch_id)
        raise reported or FencedError(
            f"the Spark job ended but batch {batch_id} is {done.state.value}, not PREPARED", retriable=True)
    if done.state is BatchState.COMMITTED:
        operator.log.info("batch %s was committed meanwhile by another run's recovery", batch_id)
    return {"batch": str(batch_id), "action": "prepared", "state": done.state.value,
            "input_records": done.input_records, "output_records": done.output_records,
            "attempt": f"e{done.epoch}", "spark_conn_id": operator.spark_conn_id}
