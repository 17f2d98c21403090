"""The executor-to-driver plumbing of every partition-writer sink, in one place.

`run_partition_writers(frame, writer)` runs `writer.write(partition, batches)` once per Spark
partition with `mapInArrow` (a DataFrame action, so the write's Observations, the record
counts, fire), and brings back one pickled commit message per partition with `collect()`.
An ExactlyOnceError the writer raises crosses the JVM as text: it is wrapped in one
envelope (class, message, `retriable`) and raised again on the driver as the same error,
so a sink error on an executor fails the task exactly as it would on the driver.
"""

from __future__ import annotations

import importlib.util
import json
import pickle
import re
from functools import partial
from typing import Any, Iterator

from airflow_exactly_once.core.claim import ClaimCheck
from airflow_exactly_once.core.errors import ExactlyOnceError, SinkError, error_from_dict, error_to_dict
from airflow_exactly_once.core.sink import PartitionWriter

_ENVELOPE = re.compile(r"AEO-ERROR(\{.*?\})AEO-END", re.DOTALL)
MESSAGE_SCHEMA = "message binary"


class PartitionWriteFailed(RuntimeError):
    """Raised on an executor; its text carries the writer's error through Spark to the driver."""

    def __init__(self, error: ExactlyOnceError) -> None:
        super().__init__(f"AEO-ERROR{json.dumps(error_to_dict(error))}AEO-END")


def error_from_spark(exc: BaseException) -> ExactlyOnceError | None:
    """The error a partition writer raised, out of Spark's exception text (None: not a writer's error)."""
    match = _ENVELOPE.search(str(exc))
    return None if match is None else error_from_dict(json.loads(match.group(1)))


def _write_partition(writer: PartitionWriter, claim: ClaimCheck | None, batches: Iterator[Any]) -> Iterator[Any]:
    """What mapInArrow runs in the executor's Python worker."""
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise SinkError("a partition writer runs inside a Spark task (mapInArrow), where Spark gives it its "
                        "TaskContext; this one ran outside any", retriable=False)
    partition = context.partitionId()
    try:
        message = writer.write(partition, batches, claim)
    except ExactlyOnceError as exc:
        raise PartitionWriteFailed(exc) from None
    except Exception as exc:  # a bug or an unexpected client error: say which sink and partition
        raise PartitionWriteFailed(SinkError(
            f"the {type(writer).__name__} of Spark partition {partition} failed: {type(exc).__name__}: {exc}",
            retriable=True)) from None
    if message is not None:
        yield pa.RecordBatch.from_pydict({"message": [pickle.dumps(message)]})


def run_partition_writers(frame: Any, writer: PartitionWriter, claim: ClaimCheck | None = None) -> list[Any]:
    """Run `writer` on every partition of `frame`; the commit messages of the partitions that staged output.

    `claim` (the write attempt's hold on its batch) is handed to every partition's writer.
    """
    if importlib.util.find_spec("pyarrow") is None:  # the executors receive the rows as Arrow batches
        raise SinkError("writing this sink needs pyarrow on the Spark driver and executors: pip install pyarrow",
                        retriable=False)
    try:
        rows = frame.mapInArrow(partial(_write_partition, writer, claim), MESSAGE_SCHEMA).collect()
    except Exception as exc:
        error = error_from_spark(exc)
        if error is None:
            raise  # reading or transforming failed: the Spark job explains it
        raise error from None
    return [pickle.loads(row.message) for row in rows]
