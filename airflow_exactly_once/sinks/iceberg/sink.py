"""Apache Iceberg with a two-phase commit on Iceberg's own write-audit-publish.

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

Spec: {"type": "iceberg", "table": "namespace.name", "warehouse": "/data/lake" | "s3://...",
       "catalog": {"type": "embedded" | "postgres", "name": "iceberg", "path": ..., "conn_id": ..., "url": ...},
       "create_table": False, "table_properties": {...}, "partitioned_by": ["column", ...]}
"""

from __future__ import annotations

import logging
import re
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError, SinkError, raise_explained
from airflow_exactly_once.core.lineage_names import DatasetName, file_dataset
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import RunWriters, Sink, column_names
from airflow_exactly_once.sinks.iceberg import snapshots as snaps
from airflow_exactly_once.sinks.iceberg.catalog import CatalogSpec
from airflow_exactly_once.sinks.iceberg.committable import StagedSnapshot
from airflow_exactly_once.sinks.iceberg.committer import TableCommitter, TableGone, view
from airflow_exactly_once.sinks.iceberg.runtime import ICEBERG_SPARK_RUNTIME, readable
from airflow_exactly_once.sinks.iceberg.spec import IcebergSpec

log = logging.getLogger(__name__)

WAP_ENABLED = "write.wap.enabled"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _quote(*parts: str) -> str:
    return ".".join(f"`{p}`" for p in parts)


class IcebergSink(Sink):
    spec_type = IcebergSpec
    supports_retract = True
    splits_reads = True  # one staged snapshot, however many Spark partitions wrote it
    committable_type = StagedSnapshot

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        table = spec.get("table")
        parts = table.split(".") if isinstance(table, str) else []
        if len(parts) != 2 or not all(_IDENT.match(p) for p in parts):
            raise ConfigurationError(f"the iceberg sink's table must be 'namespace.name' (letters, digits, '_'), not "
                                     f"{table!r}, e.g. {{'type': 'iceberg', 'table': 'db.events', "
                                     "'warehouse': '/data/lake'}")
        self.namespace, self.table_name = parts
        self.table: str = table
        self.catalog = CatalogSpec.from_spec(spec)
        self.create_table = spec.get("create_table", False)
        if not isinstance(self.create_table, bool):
            raise ConfigurationError("the iceberg sink's create_table must be True or False")
        self.table_properties = {str(k): str(v) for k, v in (spec.get("table_properties") or {}).items()}
        self.partitioned_by = column_names(spec.get("partitioned_by"), "the iceberg sink's partitioned_by")
        self.committer = TableCommitter(self.catalog, self.table)

    @property
    def spark_table(self) -> str:
        """The table as Spark names it: catalog.namespace.name."""
        return _quote(self.catalog.name, self.namespace, self.table_name)

    def lineage_dataset(self) -> DatasetName:
        """The table's files where its catalog puts a new table (`{warehouse}/{namespace}/{name}`), as
        OpenLineage's Spark integration names Iceberg tables by their location."""
        return file_dataset(f"{self.catalog.warehouse.rstrip('/')}/{self.namespace}/{self.table_name}")

    def spark_packages(self) -> list[str]:
        return [ICEBERG_SPARK_RUNTIME, self.catalog.jdbc_package()]

    # -- plan ----------------------------------------------------------------------

    def check(self, pipeline_id: str) -> None:
        """The catalog reachable, the table there (or created on first write), WAP enabled on it."""
        if not self.committer.exists():
            if self.create_table:
                return  # created from the transform's schema by the first write
            raise ConfigurationError(
                f"table {self.table} does not exist in the Iceberg {self.catalog.describe()}: create it (Spark SQL: "
                f"CREATE TABLE {self.catalog.name}.{self.table} (...) USING iceberg), or let the first write create "
                "it from the transform's schema with 'create_table': True")
        table = self.committer.load()
        if table.properties.get(WAP_ENABLED) != "true":
            with table.transaction() as tx:
                tx.set_properties(**{WAP_ENABLED: "true"})

    # -- write ---------------------------------------------------------------------

    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> StagedSnapshot:
        """Spark's Iceberg writer appends the batch as a staged snapshot (invisible on main)."""
        spark = frame.sparkSession
        self.committer.catalog()  # pyiceberg creates the catalog's tables if they are missing (see CatalogSpec)
        self._configure(spark)
        try:
            self._check_columns(self._ensure_table(spark, frame), frame)
        except ExactlyOnceError:
            raise
        except Exception as exc:
            raise_explained(self._explain(exc), exc)
        wap = snaps.wap_id(batch.pipeline_id, batch.seq, batch.epoch)
        summary = {**snaps.batch_summary(batch.pipeline_id, batch.seq, batch.epoch, batch.run_id), "aeo.wap": wap}
        writer = frame.writeTo(self.spark_table)
        for key, value in summary.items():
            writer = writer.option(f"snapshot-property.{key}", value)
        spark.conf.set("spark.wap.id", wap)
        try:
            writer.append()
        except Exception as exc:
            self._drop_attempt(batch, wap)
            raise_explained(self._explain(exc), exc)
        finally:
            spark.conf.unset("spark.wap.id")
        staged = self._staged_snapshot(wap)
        if staged is None:
            return StagedSnapshot(self.table, wap, None, 0)
        added = staged.summary.get("added-records")  # Spark Connect reports no observation of this write
        return StagedSnapshot(self.table, wap, staged.snapshot_id, None if added is None else int(added))

    def _configure(self, spark: Any) -> None:
        """Register the catalog in the session; a long-lived session may have it already, on another database."""
        conf = self.catalog.spark_conf()
        prefix = f"spark.sql.catalog.{self.catalog.name}"
        for key in (f"{prefix}.uri", f"{prefix}.warehouse"):
            current = spark.conf.get(key, None)
            if current not in (None, conf[key]):
                raise ConfigurationError(
                    f"this Spark session already has an Iceberg catalog named {self.catalog.name!r} on {current} "
                    f"(Spark keeps a catalog once loaded); give this sink's catalog another 'name'")
        for key, value in conf.items():
            spark.conf.set(key, value)

    def _ensure_table(self, spark: Any, frame: Any) -> Any:
        """The table (pyiceberg's view, no Spark job), created from the frame's schema if asked, WAP enabled."""
        try:
            table = self.committer.load()
        except TableGone:
            table = None
        if table is not None:
            if table.properties.get(WAP_ENABLED) != "true":  # never append without WAP: it would go straight to main
                spark.sql(f"ALTER TABLE {self.spark_table} SET TBLPROPERTIES ('{WAP_ENABLED}' = 'true')")
            return table
        if not self.create_table:
            raise ConfigurationError(f"table {self.table} does not exist in the Iceberg {self.catalog.describe()} "
                                     "(dropped since the plan?); create it, or set 'create_table': True")
        columns = ", ".join(f"{_quote(f.name)} {f.dataType.simpleString()}" for f in frame.schema.fields)
        properties = {"format-version": "2", **self.table_properties, WAP_ENABLED: "true"}
        props = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
        partitions = f" PARTITIONED BY ({', '.join(_quote(c) for c in self.partitioned_by)})" if self.partitioned_by \
            else ""
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {_quote(self.catalog.name, self.namespace)}")
        spark.sql(f"CREATE TABLE IF NOT EXISTS {self.spark_table} ({columns}) USING iceberg{partitions} "
                  f"TBLPROPERTIES ({props})")
        log.info("created Iceberg table %s from the transform's schema", self.table)
        return self.committer.load()

    def _check_columns(self, table: Any, frame: Any) -> None:
        """The transform's columns against the table's, before anything is written."""
        fields = {f.name.lower(): f for f in table.schema().fields}
        given = {f.name.lower(): f.name for f in frame.schema.fields}
        extra = [given[c] for c in given if c not in fields]
        missing = [fields[c].name for c in fields if c not in given and fields[c].required]
        if extra or missing:
            shown = ", ".join(f"{f.name} {f.field_type}" for f in fields.values())
            raise ConfigurationError(
                f"the transform's output does not match Iceberg table {self.table} ({shown}):"
                f"{f' columns {extra} are not in the table;' if extra else ''}"
                f"{f' required columns {missing} are missing;' if missing else ''}"
                " fix the transform to return the table's columns, or evolve the table "
                f"(ALTER TABLE {self.catalog.name}.{self.table} ADD COLUMN ...)")

    def _explain(self, exc: Exception) -> Exception:
        text = str(exc)
        if "CATALOG_PLUGIN_CLASS_NOT_FOUND" in text or "org.apache.iceberg.spark.SparkCatalog" in text:
            return ConfigurationError(
                "Spark cannot load Iceberg's Spark runtime: give Spark the packages "
                f"{', '.join(map(readable, self.spark_packages()))} "
                "(spark.jars.packages, or --packages on a Spark Connect server), or their jars in spark.jars")
        if "No suitable driver" in text or "ClassNotFoundException: org.sqlite" in text:
            return ConfigurationError(f"Spark cannot load the JDBC driver of the Iceberg {self.catalog.describe()}: "
                                      f"give Spark the package {self.catalog.jdbc_package()}")
        if "AnalysisException" in type(exc).__name__ or "INCOMPATIBLE_DATA" in text or "Cannot write" in text:
            return ConfigurationError(
                f"Iceberg table {self.table} rejects the transform's output: {text[:600]}. Fix the transform to "
                f"return the table's column types (cast them), or evolve the table")
        if "NoSuchTableException" in text or "TABLE_OR_VIEW_NOT_FOUND" in text:
            return ConfigurationError(f"table {self.table} disappeared during the write: {text[:300]}; recreate it "
                                      "or set 'create_table': True")
        return exc

    def _staged_snapshot(self, wap: str) -> snaps.SnapshotView | None:
        """The snapshot this attempt staged (read with pyiceberg: no Spark job), checked to be staged, not on main."""
        found = [view(s) for s in self.committer.load().metadata.snapshots]
        staged = next((s for s in found if s.summary.get("aeo.wap") == wap), None)
        if staged is None:
            return None  # Spark commits nothing for an empty output
        if staged.summary.get(snaps.WAP_ID) != wap:
            raise SinkError(f"Spark appended batch attempt {wap} to main of {self.table} instead of staging it "
                            f"(snapshot {staged.snapshot_id}): the table lost '{WAP_ENABLED}=true' during the write. "
                            "Roll main back to the snapshot before it and set the property again", retriable=False)
        return staged

    def _drop_attempt(self, batch: Batch, wap: str) -> None:
        """After a failed write: the snapshot this attempt may have staged before failing."""
        try:
            staged = self._staged_snapshot(wap)
            if staged is not None:
                self.committer.drop_staged(batch, only=staged.snapshot_id)
        except Exception as exc:  # the next commit or abort of the batch drops it
            log.warning("could not drop the staged snapshot of %s: %s", wap, exc)

    # -- notify_complete / abort / retract -----------------------------------------

    def commit(self, batch: Batch, committable: StagedSnapshot) -> str:
        outcome = self.committer.publish(batch, committable)
        dropped = self.committer.drop_staged(batch)
        return f"{outcome}{f'; dropped {dropped} staged snapshot(s) of dead attempts' if dropped else ''}"

    def commit_replacing(self, batch: Batch, committable: StagedSnapshot, replaced: Batch) -> str:
        """Publish the batch and remove `replaced`'s rows in one snapshot: readers never see both or neither."""
        outcome = self.committer.publish(batch, committable, replaced=replaced)
        dropped = self.committer.drop_staged(batch)
        return f"{outcome}{f'; dropped {dropped} staged snapshot(s) of dead attempts' if dropped else ''}"

    def abort(self, batch: Batch, committable: StagedSnapshot | None) -> str:
        if committable is not None:
            if committable.snapshot_id is None:
                return "this attempt staged nothing"
            dropped = self.committer.drop_staged(batch, only=committable.snapshot_id)
            return f"dropped {dropped} staged snapshot(s) of this attempt"
        return f"dropped {self.committer.drop_staged(batch)} staged snapshot(s) of batch {batch.seq}"

    def retract(self, batch: Batch, committable: StagedSnapshot | None) -> str:
        return self.committer.withdraw(batch)
