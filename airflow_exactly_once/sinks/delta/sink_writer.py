"""The Delta Lake sink's writer: Spark's own Parquet writer stages a batch inside the table's folder.

The files go to `_aeo_staging/<pipeline>/batch-<seq>-e<epoch>/` (Hive-style partition folders below
it), where no Delta reader looks: a Delta reader reads only the files the log adds. No Delta jar is
needed in Spark: the table is created (create_table) and later committed with delta-rs.
"""

from __future__ import annotations

import json
import logging
import shutil
from typing import Any

import pyarrow.parquet as pq

from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError, raise_explained
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import RunWriters
from airflow_exactly_once.core.sink_writer import SinkWriter
from airflow_exactly_once.sinks.delta import commits
from airflow_exactly_once.sinks.delta.committable import StagedFiles
from airflow_exactly_once.sinks.delta.spec import DeltaSpec
from airflow_exactly_once.sinks.delta.target import DeltaTarget

log = logging.getLogger(__name__)

# Delta's timestamps in Parquet: INT64 microseconds (Spark's Parquet default, INT96, has no footer statistics).
TIMESTAMP_TYPE = ("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")


class DeltaSinkWriter(SinkWriter):
    spec_type = DeltaSpec
    splits_reads = True  # one staged folder, however many Spark partitions wrote it

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.target = DeltaTarget(spec)  # the table and delta-rs's access, shared with the committer

    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> StagedFiles:
        """Check the output against the table, then write it staged with Spark's Parquet writer."""
        table = self._table(frame)
        fields = self.target.fields(table)
        partitions = list(table.metadata().partition_columns)
        frame = frame.toDF(*self._table_names(fields, frame))  # the table's spelling of each column
        folder = commits.attempt_folder(batch.pipeline_id, batch.seq, batch.epoch)
        staging = self.target.root / folder
        spark = frame.sparkSession
        key, value = TIMESTAMP_TYPE
        previous = spark.conf.get(key, None)
        spark.conf.set(key, value)
        try:
            writer = frame.write.mode("overwrite")
            (writer.partitionBy(*partitions) if partitions else writer).parquet(str(staging))
            return self._staged(folder, fields)
        except Exception as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, ExactlyOnceError):
                raise
            raise_explained(self._explain(exc), exc)
        finally:
            if previous is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, previous)

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

    def _staged(self, folder: str, fields: list[dict[str, Any]]) -> StagedFiles:
        """The attempt's non-empty data files (from their footers), checked against the table's NOT NULL columns."""
        staging = self.target.root / folder
        files: list[str] = []
        records = 0
        nulls: dict[str, int] = {}
        required = set(commits.not_null_columns(fields))
        for path in sorted(staging.rglob("*.parquet")):
            if any(part.startswith((".", "_")) for part in path.relative_to(staging).parts):
                continue
            footer = pq.read_metadata(path)
            if footer.num_rows == 0:
                continue
            files.append(str(path.relative_to(self.target.root)))
            records += footer.num_rows
            for group in range(footer.num_row_groups):
                for index in range(footer.row_group(group).num_columns):
                    chunk = footer.row_group(group).column(index)
                    if chunk.path_in_schema in required and chunk.statistics is not None:
                        nulls[chunk.path_in_schema] = nulls.get(chunk.path_in_schema, 0) + chunk.statistics.null_count
        broken = {c: n for c, n in nulls.items() if n}
        if broken:
            raise ConfigurationError(f"the transform's output has nulls in NOT NULL columns of the Delta table "
                                     f"{self.target.root}: {broken} (records with a null there); filter them out or "
                                     "fill them in the transform")
        return StagedFiles(str(self.target.root), folder, tuple(files), records)

    def _explain(self, exc: Exception) -> Exception:
        text = str(exc)
        if "AnalysisException" in type(exc).__name__ or "PermissionDenied" in text or "Permission denied" in text:
            return ConfigurationError(f"Spark cannot stage the batch in the Delta table {self.target.root}: "
                                      f"{text[:600]}")
        return exc
