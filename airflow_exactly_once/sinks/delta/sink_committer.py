"""The Delta Lake sink's committer: a two-phase commit on Delta's own log, with delta-rs (no Spark, no JVM).

write (preCommit): the batch is staged in a folder of the table's own
(`_aeo_staging/<pipeline>/batch-<seq>-e<epoch>/`; Spark's Parquet writer on a local disk, a pyarrow
partition writer per Spark partition on object storage): no Delta reader reads a file the log does
not add. The committable lists those files with their sizes and footer statistics.

notify_complete (commit): one Delta commit adds the files where they are, with those statistics,
and carries the application transaction `aeo:<pipeline>:<seq>`: a batch whose transaction the
table holds is not published again. Then other attempts' folders go (on object storage: every key
under their prefixes).

abort removes the attempt's folder (every attempt's, without a committable). interval_rerun="replace":
one commit removes the old batch's files and adds the new ones; `retract` removes them alone. Their folders go
at a later commit or retraction of the pipeline, once the table's deletedFileRetentionDuration has passed
(sinks.delta.withdrawn).

Spec: {"type": "delta", "path": "/data/lake/events" | "s3://bucket/lake/events", "aws_conn_id": ...,
       "create_table": False, "partitioned_by": [...], "table_properties": {...}}
"""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError, TransactionLostError
from airflow_exactly_once.core.lineage_names import DatasetName
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.sinks.delta import batch_state, commits
from airflow_exactly_once.sinks.delta.committable import StagedFiles
from airflow_exactly_once.sinks.delta.conditional_put import check_conditional_put
from airflow_exactly_once.sinks.delta.object_folder import ObjectFolder
from airflow_exactly_once.sinks.delta.spec import DeltaSpec
from airflow_exactly_once.sinks.delta.table_commits import TableCommits
from airflow_exactly_once.sinks.delta.target import DeltaTarget, TableMissing


class DeltaSinkCommitter(SinkCommitter[StagedFiles]):
    spec_type = DeltaSpec
    supports_retract = True
    committable_type = StagedFiles

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.target = DeltaTarget(spec)  # the table and delta-rs's access, shared with the writer
        self.commits = TableCommits(self.target)

    def lineage_dataset(self) -> DatasetName:
        return self.target.lineage_dataset()

    def check(self, pipeline_id: str) -> None:
        """The folder a Delta table the sink can write (every feature it has), or free for one it creates."""
        target = self.target
        if isinstance(target.folder, ObjectFolder):
            target.folder.make()  # the bucket exists and the credentials work: a named error otherwise
            check_conditional_put(target.folder)
        if target.exists():
            target.check_writable(target.load())
            return
        if not target.create_table:
            raise ConfigurationError(
                f"{target.root} holds no Delta table (no _delta_log): point 'path' at the table's folder, create it, "
                "or let the first write create it from the transform's schema with 'create_table': True")
        foreign = [name for name in target.folder.names() if name not in (commits.STAGING, "_dead_letter")]
        if foreign:
            raise ConfigurationError(
                f"{target.root} is not a Delta table (no _delta_log) and not empty ({', '.join(foreign[:5])}): give "
                "the sink an empty or new folder to create the table in, or the folder of an existing Delta table")
        try:
            target.folder.make()
        except OSError as exc:
            raise ConfigurationError(f"cannot create the delta sink's folder {target.root}: {exc}") from exc

    def verify_staged(self, batch: Batch, committable: StagedFiles) -> None:
        try:
            if batch_state.published_attempt(self.target.load(), batch) is not None:
                return
        except TableMissing:
            pass
        missing = batch_state.missing_files(self.target.folder, committable)
        if missing:
            raise TransactionLostError(f"{len(missing)} staged file(s) of batch {batch.seq} are gone from "
                                       f"{self.target.root} (e.g. {missing[0]}) and were never published",
                                       sink=self.type_name, batch=batch.seq, lost=missing,
                                       reason="its staged files were removed")

    def commit(self, batch: Batch, committable: StagedFiles) -> str:
        return self._publish(batch, committable)

    def commit_replacing(self, batch: Batch, committable: StagedFiles, replaced: Batch) -> str:
        """Publish the batch and remove `replaced`'s files in one commit: readers never see both or neither."""
        return self._publish(batch, committable, replaced)

    def _publish(self, batch: Batch, committable: StagedFiles, replaced: Batch | None = None) -> str:
        old = self.committable(replaced.handles) if replaced is not None else None
        outcome = self.commits.publish(batch, committable, replaced, old.files if old is not None else ())
        dropped = self.commits.drop_attempts(batch)
        return (f"{outcome}{f'; removed {dropped} staged folder(s) of other attempts' if dropped else ''}"
                f"{self.commits.delete_withdrawn(batch.pipeline_id)}")

    def abort(self, batch: Batch, committable: StagedFiles | None) -> str:
        if committable is not None:
            dropped = self.commits.drop_attempts(batch, only=committable.folder)
            return f"removed {dropped} staged folder(s) of this attempt"
        dropped = self.commits.drop_attempts(batch)
        return f"removed {dropped} staged folder(s) of batch {batch.seq}"

    def retract(self, batch: Batch, committable: StagedFiles | None) -> str:
        outcome = self.commits.withdraw(batch, committable.files if committable is not None else ())
        return f"{outcome}{self.commits.delete_withdrawn(batch.pipeline_id)}"
