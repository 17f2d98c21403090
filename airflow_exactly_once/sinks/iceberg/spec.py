"""The Iceberg sink's settings, declared once (docs table, unknown keys)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from airflow_exactly_once.core.declaration import SinkSpec, argument
from airflow_exactly_once.core.secrets import SECRET_KEY_PATTERN
from airflow_exactly_once.sinks.iceberg.runtime import ICEBERG_SPARK_RUNTIME


@dataclass(kw_only=True)
class IcebergSpec(SinkSpec):
    type_name = "iceberg"
    writer_class = "airflow_exactly_once.sinks.iceberg.sink_writer:IcebergSinkWriter"
    committer_class = "airflow_exactly_once.sinks.iceberg.sink_committer:IcebergSinkCommitter"
    line_packages = (ICEBERG_SPARK_RUNTIME,)
    local_folder_keys = ("warehouse",)
    shared_storage = ("object storage (warehouse 's3://...', with a PostgreSQL or REST catalog) or a folder every worker "
                      "mounts at the same path")

    @classmethod
    def local_folders(cls, spec: Mapping[str, Any]) -> list[tuple[str, str]]:
        """A REST catalog's warehouse is the one its server serves (a name or the server's location), not a folder
        of the machine a task runs on."""
        catalog = spec.get("catalog")
        if isinstance(catalog, Mapping) and catalog.get("type") == "rest":
            return []
        return super().local_folders(spec)

    table: str = argument(doc="`namespace.name` in the catalog (Spark names it `<catalog name>.<namespace>.<name>`)")
    warehouse: str | None = argument(None, "Where table files go: an absolute path, or a URI (`s3://...`) with a "
                                           "PostgreSQL catalog. With a REST catalog: the warehouse the catalog serves "
                                           "(its name or location, as the catalog expects; passed as Iceberg's "
                                           "`warehouse` property), optional when the catalog has a default one",
                                     shown_default="required, except with a REST catalog")
    catalog: dict[str, Any] | None = argument(None, "`{\"type\": \"embedded\"}`: a SQLite file "
                                                    "(`_iceberg_catalog.sqlite`) under a local warehouse, no server; "
                                                    "or `{\"type\": \"postgres\", \"conn_id\": \"<Airflow postgres "
                                                    "connection>\"}` / `\"url\": \"postgresql://user@host:5432/db\"`: "
                                                    "Iceberg's JDBC catalog on PostgreSQL. `name`: the catalog name "
                                                    "in Spark and in the catalog's rows (other Spark jobs reading the "
                                                    "table must use the same name). `properties`: Iceberg catalog "
                                                    "properties (e.g. `s3.endpoint`, `s3.access-key-id`, "
                                                    "`s3.secret-access-key`) for pyiceberg and Spark alike. Or "
                                                    "`{\"type\": \"rest\", \"uri\": \"http://catalog:8181\"}` "
                                                    "(or `\"conn_id\"`: an Airflow connection, host = uri, "
                                                    "password = token): an Iceberg REST catalog, with `credential` "
                                                    "(`client_id:client_secret`) or `token`, `headers`, and "
                                                    "Iceberg's REST properties in `properties` (`oauth2-server-uri`, "
                                                    "`scope`, `rest.client.socket-timeout-ms`, ...). Keys "
                                                    "matching Spark's redaction rule (secret, password, token, "
                                                    "access key, credential, authorization) and a url's password "
                                                    "are secrets",
                                              secret_keys=SECRET_KEY_PATTERN, shown_default="embedded, named `iceberg`")
    create_table: bool = argument(False, "Create the table on the first write from the transform's schema (format "
                                         "version 2)", shown_default="`False`: a missing table is a plan-time error")
    table_properties: dict[str, str] | None = argument(None, "Properties of a table the sink creates")
    partitioned_by: list[str] | None = argument(None, "Identity partition columns of a table the sink creates "
                                                      "(create it yourself for other transforms)")
