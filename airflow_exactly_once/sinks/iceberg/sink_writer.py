"""The Iceberg sink's writer: Spark's Iceberg writer appends a batch as a *staged* snapshot.

Write-audit-publish (WAP): `spark.wap.id` on a table with `write.wap.enabled=true` puts the
snapshot in the table's metadata, but no branch points at it, so readers of main see nothing of
it. Its summary carries the batch id (pipeline, batch_seq, attempt, run). The committable is its
snapshot id; the committer (sinks.iceberg.sink_committer) publishes it.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError, SinkError, raise_explained
from airflow_exactly_once.core.line_packages import LinePackage, default_scala
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.secrets import SPARK_OPTIONS_REDACTION, widened_options_redaction
from airflow_exactly_once.core.sink import RunWriters
from airflow_exactly_once.core.sink_writer import SinkWriter
from airflow_exactly_once.sinks.iceberg import snapshots as snaps
from airflow_exactly_once.sinks.iceberg.committable import StagedSnapshot
from airflow_exactly_once.sinks.iceberg.table_committer import TableGone, view
from airflow_exactly_once.sinks.iceberg.runtime import ICEBERG_SPARK_RUNTIME
from airflow_exactly_once.sinks.iceberg.spec import IcebergSpec
from airflow_exactly_once.sinks.iceberg.target import WAP_ENABLED, IcebergTarget, quoted

log = logging.getLogger(__name__)


class IcebergSinkWriter(SinkWriter):
    spec_type = IcebergSpec
    splits_reads = True  # one staged snapshot, however many Spark partitions wrote it
    changes_session_conf = True  # spark.wap.id for the append (Iceberg reads the WAP id from the session)

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.target = IcebergTarget(spec)  # the table, its catalog and pyiceberg's access, shared with the committer

    def spark_packages(self) -> list[str | LinePackage]:
        """Iceberg's runtime, the catalog's JDBC driver, and the AWS SDK bundle for S3FileIO (a warehouse on object
        storage)."""
        catalog = self.target.catalog
        return [ICEBERG_SPARK_RUNTIME, *[p for p in (catalog.jdbc_package(), catalog.file_io_package()) if p]]

    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> StagedSnapshot:
        """Spark's Iceberg writer appends the batch as a staged snapshot (invisible on main)."""
        spark = frame.sparkSession
        self.target.table_committer.catalog()  # pyiceberg creates the catalog's tables if missing (see CatalogSpec)
        self._configure(spark)
        try:
            table = self._ensure_table(spark, frame)
            self.target.check_storage(table)
            self._check_columns(table, frame)
        except ExactlyOnceError:
            raise
        except Exception as exc:
            raise_explained(self._explain(exc, spark), exc)
        wap = snaps.wap_id(batch.pipeline_id, batch.seq, batch.epoch)
        summary = {**snaps.batch_summary(batch.pipeline_id, batch.seq, batch.epoch, batch.run_id), "aeo.wap": wap}
        writer = frame.writeTo(self.target.spark_table)
        for key, value in summary.items():
            writer = writer.option(f"snapshot-property.{key}", value)
        spark.conf.set("spark.wap.id", wap)
        try:
            writer.append()
        except Exception as exc:
            self._drop_attempt(batch, wap)
            raise_explained(self._explain(exc, spark), exc)
        finally:
            spark.conf.unset("spark.wap.id")
        staged = self._staged_snapshot(wap)
        if staged is None:
            return StagedSnapshot(self.target.table, wap, None, 0)
        added = staged.summary.get("added-records")  # Spark Connect reports no observation of this write
        return StagedSnapshot(self.target.table, wap, staged.snapshot_id, None if added is None else int(added))

    def _configure(self, spark: Any) -> None:
        """Register the catalog in the session; a long-lived session may have it already, on another database."""
        catalog = self.target.catalog
        conf = catalog.spark_conf()
        prefix = f"spark.sql.catalog.{catalog.name}"
        for key in (f"{prefix}.type", f"{prefix}.uri", f"{prefix}.warehouse"):
            current = spark.conf.get(key, None)
            if current not in (None, conf.get(key)):
                raise ConfigurationError(
                    f"this Spark session already has an Iceberg catalog named {catalog.name!r} on {current} "
                    f"(Spark keeps a catalog once loaded); give this sink's catalog another 'name'")
        configure_catalog(spark, conf)

    def _ensure_table(self, spark: Any, frame: Any) -> Any:
        """The table (pyiceberg's view, no Spark job), created from the frame's schema if asked, WAP enabled."""
        target = self.target
        try:
            table = target.table_committer.load()
        except TableGone:
            table = None
        if table is not None:
            if table.properties.get(WAP_ENABLED) != "true":  # never append without WAP: it would go straight to main
                spark.sql(f"ALTER TABLE {self.target.spark_table} SET TBLPROPERTIES ('{WAP_ENABLED}' = 'true')")
            return table
        if not target.create_table:
            raise ConfigurationError(f"table {target.table} does not exist in the Iceberg {target.catalog.describe()} "
                                     "(dropped since the plan?); create it, or set 'create_table': True")
        columns = ", ".join(f"{quoted(f.name)} {f.dataType.simpleString()}" for f in frame.schema.fields)
        properties = {"format-version": "2", **self.target.table_properties, WAP_ENABLED: "true"}
        props = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
        partitions = f" PARTITIONED BY ({', '.join(quoted(c) for c in target.partitioned_by)})" \
            if target.partitioned_by else ""
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {quoted(self.target.catalog.name, self.target.namespace)}")
        spark.sql(f"CREATE TABLE IF NOT EXISTS {self.target.spark_table} ({columns}) USING iceberg{partitions} "
                  f"TBLPROPERTIES ({props})")
        log.info("created Iceberg table %s from the transform's schema", self.target.table)
        return self.target.table_committer.load()

    def _check_columns(self, table: Any, frame: Any) -> None:
        """The transform's columns against the table's, before anything is written."""
        fields = {f.name.lower(): f for f in table.schema().fields}
        given = {f.name.lower(): f.name for f in frame.schema.fields}
        extra = [given[c] for c in given if c not in fields]
        missing = [fields[c].name for c in fields if c not in given and fields[c].required]
        if extra or missing:
            shown = ", ".join(f"{f.name} {f.field_type}" for f in fields.values())
            raise ConfigurationError(
                f"the transform's output does not match Iceberg table {self.target.table} ({shown}):"
                f"{f' columns {extra} are not in the table;' if extra else ''}"
                f"{f' required columns {missing} are missing;' if missing else ''}"
                " fix the transform to return the table's columns, or evolve the table "
                f"(ALTER TABLE {self.target.catalog.name}.{self.target.table} ADD COLUMN ...)")

    def _packages_for(self, spark_version: str) -> list[str]:
        """The packages as coordinates for the write's Spark (a Spark Connect server's may not be the installed
        pyspark; its Scala is taken to be that of Apache's builds), a line without a runtime as its error."""
        try:
            driver = self.target.catalog.jdbc_package()
            return [ICEBERG_SPARK_RUNTIME.coordinates(spark_version, default_scala(spark_version), "the write's Spark"),
                    *[p for p in (driver, self.target.catalog.file_io_package()) if p]]
        except ConfigurationError as exc:
            return [f"(none: {exc})"]

    def _explain(self, exc: Exception, spark: Any) -> Exception:
        text = str(exc)
        if "CATALOG_PLUGIN_CLASS_NOT_FOUND" in text or "org.apache.iceberg.spark.SparkCatalog" in text:
            spark_version = spark.version  # the Spark that writes: on Spark Connect, the server's
            return ConfigurationError(
                f"Spark {spark_version} cannot load Iceberg's Spark runtime: give Spark the packages "
                f"{', '.join(self._packages_for(spark_version))} "
                "(spark.jars.packages, or --packages on a Spark Connect server), or their jars in spark.jars")
        if "No suitable driver" in text or "ClassNotFoundException: org.sqlite" in text:
            catalog = self.target.catalog
            return ConfigurationError(f"Spark cannot load the JDBC driver of the Iceberg {catalog.describe()}: "
                                      f"give Spark the package {catalog.jdbc_package()}")
        storage = self.target.catalog.storage
        refused = storage.explain_spark_error(text, self.target.table) if storage is not None else None
        if refused is not None:
            return refused
        if "AnalysisException" in type(exc).__name__ or "INCOMPATIBLE_DATA" in text or "Cannot write" in text:
            return ConfigurationError(
                f"Iceberg table {self.target.table} rejects the transform's output: {text[:600]}. Fix the transform "
                f"to return the table's column types (cast them), or evolve the table")
        if "NoSuchTableException" in text or "TABLE_OR_VIEW_NOT_FOUND" in text:
            return ConfigurationError(f"table {self.target.table} disappeared during the write: {text[:300]}; "
                                      "recreate it or set 'create_table': True")
        return exc

    def _staged_snapshot(self, wap: str) -> snaps.SnapshotView | None:
        """The snapshot this attempt staged (read with pyiceberg: no Spark job), checked to be staged, not on main."""
        found = [view(s) for s in self.target.table_committer.load().metadata.snapshots]
        staged = next((s for s in found if s.summary.get("aeo.wap") == wap), None)
        if staged is None:
            return None  # Spark commits nothing for an empty output
        if staged.summary.get(snaps.WAP_ID) != wap:
            raise SinkError(f"Spark appended batch attempt {wap} to main of {self.target.table} instead of staging "
                            f"it (snapshot {staged.snapshot_id}): the table lost '{WAP_ENABLED}=true' during the "
                            "write. Roll main back to the snapshot before it and set the property again",
                            retriable=False)
        return staged

    def _drop_attempt(self, batch: Batch, wap: str) -> None:
        """After a failed write: the snapshot this attempt may have staged before failing."""
        try:
            staged = self._staged_snapshot(wap)
            if staged is not None:
                self.target.table_committer.drop_staged(batch, only=staged.snapshot_id)
        except Exception as exc:  # the next commit or abort of the batch drops it
            log.warning("could not drop the staged snapshot of %s: %s", wap, exc)


def configure_catalog(spark: Any, conf: dict[str, str]) -> None:
    """Set a catalog's session settings, its secrets hidden first: Spark's UI lists every setting a query's session
    changed (SQL tab) and redacts only keys or values that match its patterns, which a REST catalog's `credential`
    (`client_id:client_secret`) and `header.Authorization` do not by default."""
    widened = widened_options_redaction(spark.conf.get(SPARK_OPTIONS_REDACTION, None))
    if widened is not None:
        spark.conf.set(SPARK_OPTIONS_REDACTION, widened)
    for key, value in conf.items():
        spark.conf.set(key, value)
