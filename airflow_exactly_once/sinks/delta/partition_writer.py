"""The Delta sink's partition writer on object storage: one Spark partition, on an executor, written by pyarrow into
the attempt's staging prefix (no Spark S3A, no Hadoop jars in the user's Spark).

Each file goes up as a multipart upload (storage.multipart.UploadStream: at most three parts in memory, two of them
uploading) that the writer completes itself: staged files are invisible to Delta readers anyway (the log does not
add them), and a completed object is what delta-rs's commit points at. A partitioned table's partition sorts its
rows by the partition columns first (sortWithinPartitions, no shuffle), so the writer holds one file open at a time
and starts the next when the values change: one file per partition value per Spark partition, in Hive-style folders,
the partition columns left out of the file as Spark leaves them out. The commit message of each file carries what
its add action needs (size, rows, Delta statistics from the FileMetaData pyarrow wrote, the partition values):
notify_complete reads none of the batch's objects.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_exactly_once.core.claim import ClaimCheck
from airflow_exactly_once.core.sink import PartitionWriter
from airflow_exactly_once.sinks.delta.commits import hive_folder, partition_text
from airflow_exactly_once.sinks.delta.committable import StagedFile
from airflow_exactly_once.sinks.delta.stats import described, null_counts, refuse_nulls
from airflow_exactly_once.storage import multipart
from airflow_exactly_once.storage.multipart import UploadStream
from airflow_exactly_once.storage.s3_client import S3Access, explained, shared_client

PART_SIZE = 8 * 1024 * 1024  # per part (a writer holds at most three); S3 needs 5 MiB at least


def value_runs(batch: Any, columns: tuple[str, ...]) -> list[tuple[int, int]]:
    """(start, end) of each run of rows of `batch` with equal values in `columns` (nulls equal to each other)."""
    rows = batch.num_rows
    if not columns or rows < 2:
        return [(0, rows)] if rows else []
    changed = None
    for column in columns:
        values = batch.column(column)
        before, after = values.slice(0, rows - 1), values.slice(1)
        differs = pc.or_(pc.fill_null(pc.not_equal(before, after), False),
                         pc.xor(pc.is_null(before), pc.is_null(after)))
        changed = differs if changed is None else pc.or_(changed, differs)
    starts = [0, *(int(i) + 1 for i in pc.indices_nonzero(changed).to_pylist())]
    return list(zip(starts, [*starts[1:], rows]))


@dataclass(frozen=True)
class DeltaPartitionWriter(PartitionWriter):
    """Everything a partition needs, pickled to the executors (`access` may hold keys: never in a message)."""

    access: S3Access
    bucket: str
    conn_hint: str
    table_key: str  # the table's key prefix
    folder: str  # the attempt's folder, relative to the table
    table: str  # the table as errors name it
    partitions: tuple[str, ...] = ()
    not_null: tuple[str, ...] = ()
    part_size: int = PART_SIZE

    def write(self, partition: int, batches: Iterator[Any], claim: ClaimCheck | None = None) -> list[StagedFile]:
        first = next((b for b in batches if b.num_rows), None)
        if first is None:
            return []  # an empty partition stages no file
        if claim is not None:  # an aborted batch's zombie must not leave files behind
            claim.ensure(f"writing Spark partition {partition} to {self.table}")
        try:
            client = shared_client(self.access)
        except Exception as exc:
            raise explained(exc, self.access, self.bucket, f"writing to {self.table}", self.conn_hint) from None
        staged: list[StagedFile] = []
        current: _OpenFile | None = None
        try:
            for batch in (first, *batches):
                for start, end in value_runs(batch, self.partitions):
                    rows = batch.slice(start, end - start)
                    values = {c: partition_text(rows.column(c)[0].as_py()) for c in self.partitions}
                    if current is None or current.values != values:
                        if current is not None:
                            staged.append(self._finish(client, current))
                        current = self._open(client, partition, len(staged), values, rows)
                    current.write(rows.select([n for n in rows.schema.names if n not in self.partitions]))
            if current is not None:
                staged.append(self._finish(client, current))
                current = None
        except Exception as exc:
            if current is not None:
                current.abort()  # what this writer completed goes with the attempt's folder
            raise explained(exc, self.access, self.bucket, f"staging Spark partition {partition} in {self.table}",
                            self.conn_hint) from None
        return staged

    def _open(self, client: Any, partition: int, number: int, values: dict[str, str | None],
              rows: Any) -> "_OpenFile":
        relative = f"{self.folder}/{hive_folder(values)}part-{partition:05d}-{number:04d}.parquet"
        schema = rows.select([n for n in rows.schema.names if n not in self.partitions]).schema
        stream = UploadStream(client, self.bucket, f"{self.table_key}/{relative}", self.part_size)
        return _OpenFile(relative, values, stream, schema)

    def _finish(self, client: Any, file: "_OpenFile") -> StagedFile:
        """Close the file, check its NOT NULL columns, and complete its upload."""
        metadata = file.close()
        nulls = null_counts(metadata, self.not_null)
        if any(nulls.values()):
            file.stream.abort()
            refuse_nulls(nulls, self.table)
        upload = file.stream.staged()
        multipart.complete(client, self.bucket, upload)
        return described(file.relative, upload.bytes, int(time.time() * 1000), metadata, file.values)


class _OpenFile:
    """One Parquet file being written into an open upload."""

    def __init__(self, relative: str, values: dict[str, str | None], stream: UploadStream, schema: Any) -> None:
        self.relative, self.values, self.stream = relative, values, stream
        # Delta's timestamps: INT64 microseconds (never INT96, which has no statistics).
        self.parquet = pq.ParquetWriter(stream, schema, coerce_timestamps="us", allow_truncated_timestamps=False)

    def write(self, rows: Any) -> None:
        self.parquet.write_batch(rows)

    def close(self) -> Any:
        """The file's FileMetaData, as pyarrow wrote its footer."""
        self.parquet.close()
        return self.parquet.writer.metadata

    def abort(self) -> None:
        try:
            self.stream.abort()
        except Exception:  # noqa: BLE001 - the attempt's folder (and its open uploads) goes with the abort
            pass
