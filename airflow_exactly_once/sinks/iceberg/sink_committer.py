"""The Iceberg sink's committer: a two-phase commit on Iceberg's own write-audit-publish.

write (preCommit): Spark's Iceberg writer appends the batch as a *staged* snapshot (WAP:
`spark.wap.id` on a table with `write.wap.enabled=true`): the snapshot is in the table's
metadata, but no branch points at it, so readers of main see nothing of it. Its summary
carries the batch id (pipeline, batch_seq, attempt, run). The committable is its snapshot id.

notify_complete (commit): pyiceberg, against the same catalog, publishes that snapshot to
main: a fast-forward when main has not moved since, else a cherry-pick (a new append
snapshot with the batch's data files: appends commute, so parallel interval batches publish
in any order). A batch whose id is already in main's history is not published again. Then
the staged snapshots of other attempts (fenced, killed) are dropped.

abort drops the staged snapshots of the batch (metadata first, then their files).
interval_rerun="replace": the replacement publishes the new rows and removes the old batch's
files in one overwrite snapshot; `retract` removes them alone.

Spec: {"type": "iceberg", "table": "namespace.name", "warehouse": "/data/lake" | "s3://...", "aws_conn_id": ...,
       "catalog": {"type": "embedded" | "postgres" | "rest", "name": "iceberg", "path": ..., "conn_id": ..., "url": ...},
       "create_table": False, "table_properties": {...}, "partitioned_by": ["column", ...]}
"""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.lineage_names import DatasetName
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.sinks.iceberg.committable import StagedSnapshot
from airflow_exactly_once.sinks.iceberg.spec import IcebergSpec
from airflow_exactly_once.sinks.iceberg.target import WAP_ENABLED, IcebergTarget


class IcebergSinkCommitter(SinkCommitter[StagedSnapshot]):
    spec_type = IcebergSpec
    supports_retract = True
    committable_type = StagedSnapshot

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.target = IcebergTarget(spec)  # the table, its catalog and pyiceberg's access, shared with the writer

    def lineage_dataset(self) -> DatasetName:
        return self.target.lineage_dataset()

    def check(self, pipeline_id: str) -> None:
        """The catalog reachable, the table there (or created on first write), WAP enabled on it; a warehouse on object
        storage reachable with the sink's credentials."""
        target = self.target
        target.check_storage()
        if not target.table_committer.exists():
            if target.create_table:
                return  # created from the transform's schema by the first write
            raise ConfigurationError(
                f"table {target.table} does not exist in the Iceberg {target.catalog.describe()}: create it (Spark "
                f"SQL: CREATE TABLE {target.catalog.name}.{target.table} (...) USING iceberg), or let the first write "
                "create it from the transform's schema with 'create_table': True")
        table = target.table_committer.load()
        if table.properties.get(WAP_ENABLED) != "true":
            with table.transaction() as tx:
                tx.set_properties(**{WAP_ENABLED: "true"})

    def commit(self, batch: Batch, committable: StagedSnapshot) -> str:
        return self._publish(batch, committable)

    def commit_replacing(self, batch: Batch, committable: StagedSnapshot, replaced: Batch) -> str:
        """Publish the batch and remove `replaced`'s rows in one snapshot: readers never see both or neither."""
        return self._publish(batch, committable, replaced)

    def _publish(self, batch: Batch, committable: StagedSnapshot, replaced: Batch | None = None) -> str:
        """Publish the staged snapshot (replacing `replaced`'s rows, if given), then drop dead attempts' snapshots."""
        outcome = self.target.table_committer.publish(batch, committable, replaced=replaced)
        dropped = self.target.table_committer.drop_staged(batch)
        return f"{outcome}{f'; dropped {dropped} staged snapshot(s) of dead attempts' if dropped else ''}"

    def abort(self, batch: Batch, committable: StagedSnapshot | None) -> str:
        if committable is not None:
            if committable.snapshot_id is None:
                return "this attempt staged nothing"
            dropped = self.target.table_committer.drop_staged(batch, only=committable.snapshot_id)
            return f"dropped {dropped} staged snapshot(s) of this attempt"
        dropped = self.target.table_committer.drop_staged(batch)
        return f"dropped {dropped} staged snapshot(s) of batch {batch.seq}"

    def retract(self, batch: Batch, committable: StagedSnapshot | None) -> str:
        return self.target.table_committer.withdraw(batch)
