"""The Parquet sink's committer on object storage: complete the batch's uploads, then write its manifest entry.

A file appears whole when its upload completes; the batch is complete when its manifest entry exists (one
PUT, last). A crash between the two leaves completed files without an entry: recovery completes the rest
(an upload already completed is recognised by its object's size) and writes the entry. Withdrawing goes the
other way round: the entry first, then the objects, so a reader that follows `_manifest/` never sees both
an old and a new batch.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError, TransactionLostError
from airflow_exactly_once.core.faults import fault_point
from airflow_exactly_once.core.lineage_names import DatasetName, file_dataset
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.storage.object_location import parse_object_location
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.sinks.storage_bucket import SinkBucket
from airflow_exactly_once.sinks.parquet.s3.committable import StagedUploads
from airflow_exactly_once.sinks.parquet.s3.layout import ObjectLayout
from airflow_exactly_once.sinks.parquet.s3.uploads import BatchUploads
from airflow_exactly_once.sinks.parquet.spec import ParquetSpec
from airflow_exactly_once.storage.multipart import Completion


class S3ParquetSinkCommitter(SinkCommitter[StagedUploads]):
    spec_type = ParquetSpec
    supports_retract = True
    committable_type = StagedUploads

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.location = parse_object_location(spec["path"], "the parquet sink's path")
        self.layout = ObjectLayout(self.location)
        self.uploads = BatchUploads(SinkBucket(spec, self.location, "the parquet sink"), self.layout)

    def lineage_dataset(self) -> DatasetName:
        return file_dataset(self.location.url())

    def check(self, pipeline_id: str) -> None:
        """At plan time: the bucket exists, the credentials work, and no other pipeline owns the prefix."""
        self.uploads.check_bucket()
        owner = self.uploads.owner()
        if owner is not None and owner != pipeline_id:
            raise ConfigurationError(f"{self.location.url()} belongs to pipeline {owner!r}; give pipeline "
                                     f"{pipeline_id!r} its own output path")
        if owner is None:
            self.uploads.claim_owner(pipeline_id)

    def verify_staged(self, batch: Batch, committable: StagedUploads) -> None:
        lost = [f.key for f in committable.files if not self.uploads.is_staged(f)]
        if lost:
            raise TransactionLostError(
                f"{len(lost)} staged file(s) of batch {batch.seq} were never published and their uploads are gone "
                f"(aborted, or expired by a bucket lifecycle rule): {', '.join(lost[:5])}", sink=self.type_name,
                batch=batch.seq, lost=lost, reason="the multipart upload is no longer open")

    def commit(self, batch: Batch, committable: StagedUploads) -> str:
        if self.uploads.published(batch.seq):
            outcome = "output was already published"
        else:
            self.verify_staged(batch, committable)
            for number, file in enumerate(committable.files, 1):
                if self.uploads.complete(file) is Completion.LOST:
                    self.verify_staged(batch, committable)  # raises, naming every file that is gone
                if number == 1:
                    fault_point("notify.mid_sink_commit")
            self.uploads.put_manifest(batch.seq, self._manifest_entry(batch, committable))
            outcome = f"published {len(committable.files)} file(s) of batch_seq={batch.seq}"
        aborted = self.uploads.abort_open(batch.seq)  # leftovers of attempts that were fenced or killed
        return f"{outcome}; aborted {aborted} leftover upload(s)" if aborted else outcome

    def abort(self, batch: Batch, committable: StagedUploads | None) -> str:
        """Abort the uploads (of one attempt, or of every attempt under the batch's folder); a batch without a
        manifest entry also loses any file a partial commit completed."""
        published = self.uploads.published(batch.seq)
        if committable is not None:
            aborted = self.uploads.abort(committable.files)
            removed = 0 if published else self.uploads.delete([f.key for f in committable.files])
        else:
            aborted = self.uploads.abort_open(batch.seq)
            removed = 0 if published else self.uploads.delete(self.uploads.objects(batch.seq))
        return f"aborted {aborted} upload(s) of batch {batch.seq}" + (
            f", deleted {removed} unpublished file(s)" if removed else "")

    def retract(self, batch: Batch, committable: StagedUploads | None) -> str:
        """The manifest entry first (readers that follow it stop seeing the batch), then the files."""
        self.uploads.remove_manifest(batch.seq)
        removed = self.uploads.delete(self.uploads.objects(batch.seq))
        return f"withdrew batch_seq={batch.seq} ({removed} file(s))" if removed else \
            f"batch_seq={batch.seq} was already withdrawn"

    def commit_replacing(self, batch: Batch, committable: StagedUploads, replaced: Batch) -> str:
        """Withdraw the old batch, then publish the new one: readers never see both at once."""
        self.verify_staged(batch, committable)
        withdrawn = self.retract(replaced, None)
        return f"{withdrawn}; {self.commit(batch, committable)} in its place"

    def _manifest_entry(self, batch: Batch, committable: StagedUploads) -> dict[str, Any]:
        return {"pipeline_id": batch.pipeline_id, "batch_seq": batch.seq, "run_id": batch.run_id,
                "ranges": [r.__dict__ for r in batch.ranges],
                "files": [self.layout.relative(f.key) for f in committable.files],
                "rows": [f.rows for f in committable.files], "bytes": [f.bytes for f in committable.files],
                "input_records": batch.input_records, "output_records": batch.output_records,
                "published_at": datetime.now(timezone.utc).isoformat()}
