"""The Iceberg sink's settings, declared once (docs table, unknown keys)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from airflow_exactly_once.core.declaration import SinkSpec, argument, is_template
from airflow_exactly_once.storage.object_location import SUPPORTED_SCHEMES, scheme_of, storage_variant
from airflow_exactly_once.core.secrets import SECRET_KEY_PATTERN
from airflow_exactly_once.sinks.iceberg.runtime import ICEBERG_SPARK_RUNTIME


def is_rest(spec: Mapping[str, Any]) -> bool:
    """Whether the spec's catalog is a REST catalog (whose server decides where tables go)."""
    catalog = spec.get("catalog")
    return isinstance(catalog, Mapping) and catalog.get("type") == "rest"


@dataclass(kw_only=True)
class IcebergSpec(SinkSpec):
    type_name = "iceberg"
    writer_class = "airflow_exactly_once.sinks.iceberg.sink_writer:IcebergSinkWriter"
    committer_class = "airflow_exactly_once.sinks.iceberg.sink_committer:IcebergSinkCommitter"
    line_packages = (ICEBERG_SPARK_RUNTIME,)
    # A warehouse on object storage (s3://): the same classes, whose catalog gives both clients S3 FileIO settings
    # (sinks.iceberg.file_io); named so that the sink contract suite runs it too.
    variant_classes = {"s3": (writer_class, committer_class)}
    local_folder_keys = ("warehouse",)
    shared_storage = ("object storage (warehouse 's3://...', with a PostgreSQL or REST catalog) or a folder every worker "
                      "mounts at the same path")

    @classmethod
    def variant(cls, spec: Mapping[str, Any]) -> str | None:
        """"s3" for a warehouse on object storage; an unsupported scheme is refused, naming the supported ones (but
        for a REST catalog's warehouse, which names what its server serves, as the server spells it)."""
        warehouse = spec.get("warehouse")
        if is_rest(spec):
            return "s3" if isinstance(warehouse, str) and scheme_of(warehouse) in SUPPORTED_SCHEMES else None
        return storage_variant(warehouse, "the iceberg sink's warehouse")

    @classmethod
    def check_values(cls, spec: Mapping[str, Any], *, rendered: bool = True) -> None:
        """Also the warehouse's scheme, when the DAG is parsed."""
        super().check_values(spec, rendered=rendered)
        cls.variant(spec)

    @classmethod
    def local_folders(cls, spec: Mapping[str, Any]) -> list[tuple[str, str]]:
        """A REST catalog's warehouse is the one its server serves (a name or the server's location), not a folder
        of the machine a task runs on. The embedded catalog's SQLite file is on this machine even when the
        warehouse is on object storage."""
        if is_rest(spec):
            return []
        catalog = spec.get("catalog")
        embedded = catalog if isinstance(catalog, Mapping) and catalog.get("type", "embedded") == "embedded" else {}
        path = embedded.get("path")
        found = super().local_folders(spec)
        if isinstance(path, str) and path and not is_template(path):
            found.append(("catalog path", path))
        return found

    table: str = argument(doc="`namespace.name` in the catalog (Spark names it `<catalog name>.<namespace>.<name>`)")
    warehouse: str | None = argument(None, "Where table files go: an absolute path, or object storage "
                                           "(`s3://bucket/prefix`, Iceberg's S3FileIO; with a PostgreSQL catalog, "
                                           "or the embedded one given a catalog `path`). With a REST catalog: the warehouse the catalog serves "
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
    aws_conn_id: str | None = argument(None, "A warehouse on object storage: the Airflow `aws` connection (login = "
                                             "access key id, password = secret access key; extras `endpoint_url`, "
                                             "`region_name`, `aws_session_token`), turned into Iceberg's `s3.*` "
                                             "properties for Spark and pyiceberg when a task runs",
                                       shown_default="the catalog's `s3.*` properties, else the AWS SDKs' own "
                                                     "credentials (environment, instance role)")
    create_table: bool = argument(False, "Create the table on the first write from the transform's schema (format "
                                         "version 2)", shown_default="`False`: a missing table is a plan-time error")
    table_properties: dict[str, str] | None = argument(None, "Properties of a table the sink creates")
    partitioned_by: list[str] | None = argument(None, "Identity partition columns of a table the sink creates "
                                                      "(create it yourself for other transforms)")
