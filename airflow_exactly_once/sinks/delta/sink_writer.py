"""The Delta Lake sink's writer on a local disk: Spark's own Parquet writer stages a batch inside the table's folder
(on object storage: sinks.delta.s3_sink_writer, which shares the checks made here).

The files go to `_aeo_staging/<pipeline>/batch-<seq>-e<epoch>/` (Hive-style partition folders below
it), where no Delta reader looks: a Delta reader reads only the files the log adds. No Delta jar is
needed in Spark: the table is created (create_table) and later committed with delta-rs.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pyarrow.parquet as pq

from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError, raise_explained
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import RunWriters
from airflow_exactly_once.core.sink_writer import SinkWriter
from airflow_exactly_once.sinks.delta import commits
from airflow_exactly_once.sinks.delta.committable import StagedFiles
from airflow_exactly_once.sinks.delta.folder import LocalFolder
from airflow_exactly_once.sinks.delta.spec import DeltaSpec
from airflow_exactly_once.sinks.delta.stats import local_staged_file, null_counts, refuse_nulls
from airflow_exactly_once.sinks.delta.target import DeltaTarget

log = logging.getLogger(__name__)

# Delta's timestamps in Parquet: INT64 microseconds (Spark's Parquet default, INT96, has no footer statistics).
TIMESTAMP_TYPE = ("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")


class DeltaSinkWriter(SinkWriter):
    spec_type = DeltaSpec
    splits_reads = True  # one staged folder, however many Spark partitions wrote it
    changes_session_conf = True  # Parquet's timestamp type, set for its Spark write and put back after

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.target = DeltaTarget(spec)  # the table and delta-rs's access, shared with the committer

    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> StagedFiles:
        """Check the output against the table, then write it staged (removed again when the write fails)."""
        table = self._table(frame)
        fields = self.target.fields(table)
        partitions = list(table.metadata().partition_columns)
        frame = frame.toDF(*self._table_names(fields, frame))  # the table's spelling of each column
        folder = commits.attempt_folder(batch.pipeline_id, batch.seq, batch.epoch)
        try:
            return self._write(frame, folder, fields, partitions, run_writers)
        except Exception as exc:
            self._remove(folder)
            if isinstance(exc, ExactlyOnceError):
                raise
            raise_explained(self._explain(exc), exc)

    def _remove(self, folder: str) -> None:
        """What a failed write staged; what cannot be removed now goes with the batch's abort."""
        try:
            self.target.folder.delete_tree(folder)
        except (OSError, ExactlyOnceError) as exc:
            log.warning("the staged folder %s of a failed write stays until the batch's abort: %s", folder, exc)

    def _write(self, frame: Any, folder: str, fields: list[dict[str, Any]], partitions: list[str],
               run_writers: RunWriters) -> StagedFiles:
        """Spark's own Parquet writer into the attempt's folder on a local disk."""
        local = self.target.folder
        if not isinstance(local, LocalFolder):
            raise ConfigurationError(f"{self.target.root} is on object storage: the delta sink's s3 variant writes it")
        spark = frame.sparkSession
        key, value = TIMESTAMP_TYPE
        previous = spark.conf.get(key, None)
        spark.conf.set(key, value)
        try:
            writer = frame.write.mode("overwrite")
            (writer.partitionBy(*partitions) if partitions else writer).parquet(str(local.path(folder)))
        finally:
            if previous is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, previous)
        return self._staged(local, folder, fields, partitions)

    def _table(self, frame: Any) -> Any:
        """The table (delta-rs's view, no Spark job), created from the output's schema if asked; checked against
        the output before anything is written."""
        target = self.target
        if target.exists():
            table = target.load()
        elif target.create_table:
            table = target.create(frame.schema.json())
            log.info("created the Delta table %s from the transform's schema", target.root)
        else:
            raise ConfigurationError(f"{target.root} holds no Delta table (removed since the plan?); create it, or "
                                     "set 'create_table': True")
        target.check_writable(table)
        fields = target.fields(table)
        problems = commits.schema_problems(fields, json.loads(frame.schema.json())["fields"])
        if problems:
            shown = ", ".join(f"{f['name']} {f['type'] if isinstance(f['type'], str) else f['type']['type']}"
                              for f in fields)
            raise ConfigurationError(f"the transform's output does not match the Delta table {target.root} "
                                     f"({shown}): {'; '.join(problems)}. Fix the transform to return the table's "
                                     "columns and types (cast them), or evolve the table")
        types = {f["name"]: f["type"] for f in fields}
        wrong = commits.partition_type_problems(table.metadata().partition_columns, types)
        if wrong:
            raise ConfigurationError(f"the Delta table {target.root} is partitioned by {', '.join(wrong)}: the delta "
                                     "sink stages partitions of string, integer, boolean or date columns only")
        return table

    @staticmethod
    def _table_names(fields: list[dict[str, Any]], frame: Any) -> list[str]:
        names = {f["name"].lower(): f["name"] for f in fields}
        return [names[c.lower()] for c in frame.columns]

    def _staged(self, local: LocalFolder, folder: str, fields: list[dict[str, Any]],
                partitions: list[str]) -> StagedFiles:
        """The attempt's non-empty data files, described from their footers, checked against the table's NOT NULL
        columns."""
        staging = local.path(folder)
        entries = []
        nulls: dict[str, int] = {}
        required = commits.not_null_columns(fields)
        for path in sorted(staging.rglob("*.parquet")):
            if any(part.startswith((".", "_")) for part in path.relative_to(staging).parts):
                continue
            footer = pq.read_metadata(path)
            if footer.num_rows == 0:
                continue
            entries.append(local_staged_file(local.root, str(path.relative_to(local.root)), folder, partitions,
                                             footer))
            for column, count in null_counts(footer, required).items():
                nulls[column] = nulls.get(column, 0) + count
        refuse_nulls(nulls, self.target.root)
        return StagedFiles.described(self.target.root, folder, entries)

    def _explain(self, exc: Exception) -> Exception:
        text = str(exc)
        if "AnalysisException" in type(exc).__name__ or "PermissionDenied" in text or "Permission denied" in text:
            return ConfigurationError(f"Spark cannot stage the batch in the Delta table {self.target.root}: "
                                      f"{text[:600]}")
        return exc

