"""The Delta table a sink spec names, as the sink's writer and committer both need it: its folder (local, or on
object storage), delta-rs's access to it, and the checks of what the sink can write there (sinks.delta.commits
decides, this reads)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError, MissingExtraError, SinkError
from airflow_exactly_once.core.lineage_names import DatasetName, file_dataset
from airflow_exactly_once.storage.object_location import is_object_storage, parse_object_location
from airflow_exactly_once.core.sink import column_names
from airflow_exactly_once.sinks.delta import commits
from airflow_exactly_once.sinks.delta.folder import LocalFolder, TableFolder
from airflow_exactly_once.sinks.delta.object_folder import ObjectFolder
from airflow_exactly_once.sinks.storage_bucket import SinkBucket


class TableMissing(SinkError):
    """There is no Delta table (no `_delta_log`) in the sink's folder."""


def deltalake() -> Any:
    """delta-rs's Python package, from the [delta] extra."""
    try:
        import deltalake as module
    except ImportError as exc:
        raise MissingExtraError("the delta sink", "delta", exc.name) from exc
    return module


def table_folder(spec: dict[str, Any]) -> TableFolder:
    """The folder the spec's `path` names: a local one, or a prefix on object storage (s3://, s3a://)."""
    value = spec.get("path")
    if not isinstance(value, str) or not value:
        raise ConfigurationError("the delta sink needs a 'path': the table's folder, e.g. "
                                 "{'type': 'delta', 'path': '/data/lake/events'} or 's3://lake/events'")
    if is_object_storage(value):
        location = parse_object_location(value, "the delta sink's path")
        if not location.prefix:
            raise ConfigurationError(f"the delta sink's path {value!r} is a bucket's root; give the table a folder "
                                     "of its own, e.g. s3://<bucket>/lake/events")
        single_writer = spec.get("single_writer", False)
        if not isinstance(single_writer, bool):
            raise ConfigurationError("the delta sink's single_writer must be True or False")
        return ObjectFolder(location, SinkBucket(spec, location, "the delta sink"), single_writer)
    local = value.removeprefix("file://")
    if not os.path.isabs(local):
        raise ConfigurationError(f"the delta sink's path {value!r} must be absolute (tasks run in other directories)")
    return LocalFolder(Path(local.rstrip("/") or "/"))


class DeltaTarget:
    """One spec's table: checked here once for the writer and the committer."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.folder = table_folder(spec)
        self.root = self.folder.where  # the table's folder, as messages name it
        self.create_table = spec.get("create_table", False)
        if not isinstance(self.create_table, bool):
            raise ConfigurationError("the delta sink's create_table must be True or False")
        self.table_properties = {str(k): str(v) for k, v in (spec.get("table_properties") or {}).items()}
        self.partitioned_by = column_names(spec.get("partitioned_by"), "the delta sink's partitioned_by")

    def lineage_dataset(self) -> DatasetName:
        """The table's folder, as OpenLineage's Spark integration names a Delta table by its location."""
        return file_dataset(self.folder.where)

    # -- reading the table ---------------------------------------------------------

    def load(self) -> Any:
        """The table's newest version (delta-rs); TableMissing when the folder holds no Delta table."""
        module = deltalake()
        try:
            return module.DeltaTable(self.folder.uri, storage_options=self.folder.storage_options())
        except module.exceptions.TableNotFoundError as exc:
            raise TableMissing(f"{self.root} holds no Delta table (no _delta_log with a commit)",
                               retriable=False) from exc
        except OSError as exc:
            raise SinkError(f"cannot read the Delta table {self.root}: {exc}", retriable=True) from exc

    def exists(self) -> bool:
        return self.folder.has_log()

    @staticmethod
    def fields(table: Any) -> list[dict[str, Any]]:
        """The table's columns as Delta's schema JSON has them (Spark's StructType JSON: the same format)."""
        return json.loads(table.schema().to_json())["fields"]

    def features(self, table: Any) -> commits.TableFeatures:
        protocol = table.protocol()
        keys: set[str] = set()

        def collect(value: Any) -> None:
            if isinstance(value, dict):
                keys.update(value.get("metadata", {}) or {})
                for item in value.values():
                    collect(item)
            elif isinstance(value, list):
                for item in value:
                    collect(item)

        collect(self.fields(table))
        return commits.TableFeatures(protocol.min_reader_version, protocol.min_writer_version,
                                     tuple(protocol.reader_features or ()), tuple(protocol.writer_features or ()),
                                     dict(table.metadata().configuration or {}), frozenset(keys))

    def check_writable(self, table: Any) -> None:
        """ConfigurationError naming each table feature the sink cannot honour, and how to go on."""
        problems = commits.unwritable_features(self.features(table))
        if problems:
            raise ConfigurationError(
                f"the Delta table {self.root} uses table features the delta sink cannot write correctly: "
                f"{'; '.join(problems)}. Give the sink a table without them (e.g. created by the sink with "
                "'create_table': True, or by Spark without 'delta.enableDeletionVectors'; ALTER TABLE ... DROP "
                "FEATURE removes some), or write this table with Spark's own Delta writer")

    # -- creating it ---------------------------------------------------------------

    def create(self, schema_json: str) -> Any:
        """The table, created from the transform's schema (Spark's StructType JSON) if no one did meanwhile."""
        module = deltalake()
        fields = json.loads(schema_json)["fields"]
        types = {f["name"]: f["type"] for f in fields}
        unknown = [c for c in self.partitioned_by if c not in types]
        if unknown:
            raise ConfigurationError(f"the delta sink's partitioned_by names {unknown}, which the transform's output "
                                     f"does not have (its columns: {', '.join(types)})")
        wrong = commits.partition_type_problems(self.partitioned_by, types)
        if wrong:
            raise ConfigurationError(f"the delta sink partitions by string, integer, boolean or date columns only, "
                                     f"not {', '.join(wrong)}: partition by a derived date or string column")
        self.folder.make()
        try:
            return module.DeltaTable.create(self.folder.uri, schema=module.Schema.from_json(schema_json),
                                            storage_options=self.folder.storage_options(),
                                            mode="ignore", partition_by=list(self.partitioned_by) or None,
                                            configuration=self.table_properties or None)
        except module.exceptions.DeltaError as exc:
            raise ConfigurationError(f"delta-rs cannot create the Delta table {self.root} with table_properties "
                                     f"{self.table_properties}: {str(exc)[:300]}. Fix or drop the properties "
                                     "(or create the table yourself)") from exc
