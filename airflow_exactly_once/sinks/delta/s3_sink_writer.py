"""The Delta Lake sink's writer on object storage: the same checks as on a local disk (sinks.delta.sink_writer),
then a pyarrow partition writer per Spark partition stages the batch in the attempt's prefix
(sinks.delta.partition_writer), run by the executor-to-driver plumbing every partition-writer sink uses."""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.core.sink import RunWriters
from airflow_exactly_once.sinks.delta import commits
from airflow_exactly_once.sinks.delta.committable import StagedFiles
from airflow_exactly_once.sinks.delta.object_folder import ObjectFolder
from airflow_exactly_once.sinks.delta.partition_writer import DeltaPartitionWriter
from airflow_exactly_once.sinks.delta.sink_writer import DeltaSinkWriter


class S3DeltaSinkWriter(DeltaSinkWriter):
    """Staged as completed objects under `_aeo_staging/<pipeline>/batch-<seq>-e<epoch>/`, never in the log."""

    def _write(self, frame: Any, folder: str, fields: list[dict[str, Any]], partitions: list[str],
               run_writers: RunWriters) -> StagedFiles:
        store = self.target.folder
        assert isinstance(store, ObjectFolder), "the s3 variant is picked for object-storage paths only"
        if partitions:  # one file open at a time per Spark partition: rows of one partition value together
            frame = frame.sortWithinPartitions(*partitions)
        writer = DeltaPartitionWriter(
            access=store.bucket.access, bucket=store.bucket.name, conn_hint=store.bucket.conn_hint,
            table_key=store.location.key(), folder=folder, table=self.target.root, partitions=tuple(partitions),
            not_null=tuple(commits.not_null_columns(fields)))
        return StagedFiles.described(self.target.root, folder, [f for files in run_writers(frame, writer)
                                                                 for f in files])
