"""How a write that ran in another process (spark-submit) tells the Airflow task why it failed.

The task only sees spark-submit's exit code. The job writes the error class, whether a
retry can help, and the message into the batch's details in the ledger, which both sides
already share; the task raises the same error, so a transform bug fails for good with
its real message and a lost broker is retried, exactly as on the in-process path.
"""

from __future__ import annotations

from airflow_exactly_once.core.errors import ExactlyOnceError, error_from_dict, error_to_dict
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import BatchId

KEY = "write_error"


def record_failure(ledger: Ledger, batch_id: BatchId, exc: BaseException, epoch: int | None) -> None:
    """Report `exc` of the attempt holding `epoch` (None: it failed before claiming the batch)."""
    ledger.update_details(batch_id, **{KEY: {**error_to_dict(exc), "epoch": epoch}})


def clear_failure(ledger: Ledger, batch_id: BatchId) -> None:
    """Forget the report of an earlier attempt before submitting a new one."""
    if KEY in ledger.get_batch(batch_id).details:
        ledger.update_details(batch_id, **{KEY: None})


def recorded_failure(ledger: Ledger, batch_id: BatchId) -> ExactlyOnceError | None:
    """The reported error as the exception the job raised (same class and retriability), if any.

    A report of an attempt that a newer one has since fenced (an orphaned job) is ignored.
    """
    batch = ledger.get_batch(batch_id)
    report = batch.details.get(KEY)
    if not report or report.get("epoch") not in (None, batch.epoch):
        return None
    return error_from_dict(report)
