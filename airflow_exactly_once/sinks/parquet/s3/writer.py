"""The Parquet sink's partition writer on object storage: one Spark partition, one Parquet file, one open
multipart upload, on an executor.

pyarrow writes the partition's Arrow batches as a Parquet file into an UploadStream, which hands a part to
its sender threads whenever one is full: the file is never held whole in memory, and encoding overlaps the
upload. The upload is left open (the committer
completes it); its key, id, parts, rows and bytes are the partition's commit message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from airflow_exactly_once.core.claim import ClaimCheck
from airflow_exactly_once.core.sink import PartitionWriter
from airflow_exactly_once.sinks.parquet.s3.committable import StagedFile
from airflow_exactly_once.storage.multipart import UploadStream
from airflow_exactly_once.storage.s3_client import S3Access, explained, shared_client


@dataclass(frozen=True)
class UploadPartitionWriter(PartitionWriter):
    """Everything a partition needs, pickled to the executors (`access` may hold keys: never in a message)."""

    access: S3Access
    bucket: str
    key_pattern: str  # the file's key, "{partition}" filled in per partition
    part_size: int
    conn_hint: str

    def write(self, partition: int, batches: Iterator[Any], claim: ClaimCheck | None = None) -> StagedFile | None:
        import pyarrow.parquet as pq

        first = next((b for b in batches if b.num_rows), None)
        if first is None:
            return None  # an empty partition stages no file
        if claim is not None:  # an aborted batch's zombie must not leave uploads behind
            claim.ensure(f"writing Spark partition {partition} to s3://{self.bucket}")
        key = self.key_pattern.format(partition=f"{partition:05d}")
        try:
            stream = UploadStream(shared_client(self.access), self.bucket, key, self.part_size)
        except Exception as exc:
            raise explained(exc, self.access, self.bucket, f"starting the upload of {key}", self.conn_hint) from None
        rows = 0
        try:
            with pq.ParquetWriter(stream, first.schema) as parquet:
                for batch in (first, *batches):
                    if batch.num_rows:
                        parquet.write_batch(batch)
                        rows += batch.num_rows
            staged = stream.staged()
        except Exception as exc:
            stream.abort()  # nothing of this partition stays open
            raise explained(exc, self.access, self.bucket, f"uploading {key}", self.conn_hint) from None
        return StagedFile.of(staged, rows)
