"""The Parquet sink's writer on object storage: each Spark partition uploads one file it does not complete."""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.storage.object_location import parse_object_location
from airflow_exactly_once.core.sink import RunWriters
from airflow_exactly_once.core.sink_writer import SinkWriter
from airflow_exactly_once.sinks.storage_bucket import SinkBucket
from airflow_exactly_once.sinks.parquet.s3.committable import StagedUploads
from airflow_exactly_once.sinks.parquet.s3.layout import ObjectLayout
from airflow_exactly_once.sinks.parquet.s3.uploads import BatchUploads
from airflow_exactly_once.sinks.parquet.s3.writer import UploadPartitionWriter
from airflow_exactly_once.sinks.parquet.spec import ParquetSpec, part_size_bytes


class S3ParquetSinkWriter(SinkWriter):
    """Staged as open multipart uploads, one per non-empty Spark partition (spark.partition_writers runs them)."""

    spec_type = ParquetSpec
    splits_reads = True  # one file per Spark partition, however the read was split

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        location = parse_object_location(spec["path"], "the parquet sink's path")
        self.layout = ObjectLayout(location)
        self.bucket = SinkBucket(spec, location, "the parquet sink")
        self.uploads = BatchUploads(self.bucket, self.layout)

    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> StagedUploads:
        """On failure, abort this attempt's uploads (those of partitions that finished, and any left open)."""
        writer = UploadPartitionWriter(
            access=self.bucket.access, bucket=self.bucket.name, conn_hint=self.bucket.conn_hint,
            key_pattern=self.layout.file_key(batch.seq, 0, batch.epoch).replace("part-00000", "part-{partition}"),
            part_size=part_size_bytes(self.spec))
        try:
            files = run_writers(frame, writer)
        except Exception:
            self.uploads.abort_open(batch.seq, epoch=batch.epoch)
            raise
        return StagedUploads(self.bucket.name, self.layout.batch_folder(batch.seq), batch.epoch,
                             tuple(sorted(files, key=lambda f: f.key)))
