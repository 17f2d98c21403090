"""What a batch's write reports when it ends: the WriteReport, a plain dict.

The write job (spark.write_job) makes it and the launchers (spark.launch) hand it on to the write
task, which logs it and returns it as its XCom; it sits below both, so the job imports nothing of
the launchers above it. Why a write failed travels another way: core.write_report.
"""

from __future__ import annotations

from typing import TypedDict

from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.states import BatchState


class _Written(TypedDict):
    batch: str  # "<pipeline_id>:<batch_seq>"
    action: str  # "prepared" (this attempt wrote it) or "skipped" (it was past the write already)
    state: str  # the batch's state afterwards: PREPARED, or COMMITTED (by another run's recovery)


class WriteReport(_Written, total=False):
    """What a batch's write did: logged by the write task and returned as its XCom (so a plain dict)."""

    message: str  # why it was skipped
    input_records: int | None
    output_records: int | None
    attempt: str  # "e<epoch>": the attempt that holds the batch
    bad_records: int  # left out of the output by bad_record_policy (absent: none)
    spark_conn_id: str  # spark-submitted: the cluster's connection
    seconds: dict[str, float]  # spark_session (getting a Spark session) and total


def skipped(batch_id: BatchId, state: BatchState, verb: str) -> WriteReport:
    """The report of a write that found its batch PREPARED or COMMITTED already (`verb`: what it did not do)."""
    return {"batch": str(batch_id), "action": "skipped", "state": state.value,
            "message": f"batch {batch_id} is already {state.value}; nothing to {verb}"}
