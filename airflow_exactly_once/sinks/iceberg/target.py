"""The Iceberg table a sink spec names, as the sink's writer and committer both need it: its name in the catalog
and in Spark, its catalog, where its files go, and pyiceberg's access to it (sinks.iceberg.table_committer)."""

from __future__ import annotations

import re
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError, SinkError
from airflow_exactly_once.core.lineage_names import DatasetName, file_dataset
from airflow_exactly_once.core.sink import column_names
from airflow_exactly_once.sinks.iceberg.catalog import CatalogSpec
from airflow_exactly_once.sinks.iceberg.table_committer import TableCommitter, TableGone

# The table property that makes Spark stage an append (spark.wap.id) instead of committing it to main.
WAP_ENABLED = "write.wap.enabled"
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def quoted(*parts: str) -> str:
    """Names as Spark SQL quotes them: `a`.`b`."""
    return ".".join(f"`{p}`" for p in parts)


class IcebergTarget:
    """One spec's table: checked here once for the writer and the committer."""

    def __init__(self, spec: dict[str, Any]) -> None:
        table = spec.get("table")
        parts = table.split(".") if isinstance(table, str) else []
        if len(parts) != 2 or not all(_IDENT.match(p) for p in parts):
            raise ConfigurationError(f"the iceberg sink's table must be 'namespace.name' (letters, digits, '_'), not "
                                     f"{table!r}, e.g. {{'type': 'iceberg', 'table': 'db.events', "
                                     "'warehouse': '/data/lake'}")
        self.namespace, self.table_name = parts
        self.table = ".".join(parts)
        self.catalog = CatalogSpec.from_spec(spec)
        self.create_table = spec.get("create_table", False)
        if not isinstance(self.create_table, bool):
            raise ConfigurationError("the iceberg sink's create_table must be True or False")
        self.table_properties = {str(k): str(v) for k, v in (spec.get("table_properties") or {}).items()}
        self.partitioned_by = column_names(spec.get("partitioned_by"), "the iceberg sink's partitioned_by")
        self.table_committer = TableCommitter(self.catalog, self.table)

    def check_storage(self, table: Any = None) -> None:
        """A warehouse on object storage: its bucket there and the sink's credentials accepted (a clear error, not
        retried, before anything is written); the table's own bucket when the catalog placed it (REST). `table`:
        the table as just loaded (pyiceberg's), so the check loads it no second time."""
        storage = self.catalog.storage
        if storage is None:
            return
        location = None
        if storage.bucket is None:
            try:
                location = (table if table is not None else self.table_committer.load()).location()
            except TableGone:
                return  # created by the first write, where the catalog decides
        self.catalog.check_storage(location)

    @property
    def spark_table(self) -> str:
        """The table as Spark names it: catalog.namespace.name."""
        return quoted(self.catalog.name, self.namespace, self.table_name)

    def lineage_dataset(self) -> DatasetName:
        """The table's files, as OpenLineage's Spark integration names Iceberg tables by their location: where its
        catalog puts a new table (`{warehouse}/{namespace}/{name}`); a REST catalog's server decides that, so there
        the table's own location, read from the catalog."""
        if self.catalog.kind != "rest":
            return file_dataset(f"{self.catalog.warehouse.rstrip('/')}/{self.namespace}/{self.table_name}")
        try:
            return file_dataset(self.table_committer.load().location())
        except SinkError:  # not created yet, or the catalog is away: the table in the catalog's namespace
            return DatasetName(f"iceberg+{self.catalog.where()}", f"{self.catalog.warehouse or 'default'}.{self.table}")
