"""Where the Iceberg table lives: one catalog, seen the same way by Spark (the write) and pyiceberg (the commit).

Two kinds, both Iceberg's JDBC catalog (the `iceberg_tables` rows that Java's JdbcCatalog and
pyiceberg's SqlCatalog share), so the committer needs no Spark:

* `embedded` (the default, no server): a SQLite file under the warehouse folder;
* `postgres` (production): a PostgreSQL database, from an Airflow `postgres` connection
  (`conn_id`) or a `url`.

The catalog's `name` is the catalog name in Spark (`<name>.<namespace>.<table>`) and in the
catalog's rows: other Spark jobs reading the table must use the same name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from airflow_exactly_once.core.errors import ConfigurationError, MissingExtraError, SinkError

# The JDBC drivers Spark's JdbcCatalog needs, resolved by Spark like its other connectors.
SQLITE_JDBC_PACKAGE = "org.xerial:sqlite-jdbc:3.50.3.0"
POSTGRES_JDBC_PACKAGE = "org.postgresql:postgresql:42.7.4"
EMBEDDED_FILE = "_iceberg_catalog.sqlite"
KINDS = ("embedded", "postgres")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_PG_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg2")


def _warehouse(value: Any) -> tuple[str, str | None]:
    """(URI for both sides, local folder or None) of the spec's warehouse."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError("the iceberg sink needs a 'warehouse': where the table's files go, e.g. "
                                 "{'type': 'iceberg', 'table': 'db.events', 'warehouse': '/data/lake'}")
    if value.startswith("file://"):
        value = value[len("file://"):]
    if "://" in value:
        return value.rstrip("/"), None
    if not os.path.isabs(value):
        raise ConfigurationError(f"the iceberg sink's warehouse {value!r} must be an absolute path or a URI "
                                 "(tasks run in other directories)")
    return f"file://{value.rstrip('/')}", value.rstrip("/")


@dataclass(frozen=True)
class CatalogSpec:
    """One catalog: its name, kind, database and warehouse."""

    name: str
    kind: str
    warehouse: str  # URI
    url: str  # SQLAlchemy URL of the catalog database (may hold a password)
    # Iceberg catalog properties (FileIO settings such as s3.endpoint, s3.secret-access-key), given to pyiceberg
    # and to Spark's catalog alike; their secrets are declared by the spec (IcebergSpec.catalog's secret_keys).
    properties: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> "CatalogSpec":
        warehouse, local = _warehouse(spec.get("warehouse"))
        given = spec.get("catalog") or {}
        if not isinstance(given, dict):
            raise ConfigurationError("the iceberg sink's 'catalog' must be a dict, e.g. {'type': 'postgres', "
                                     "'conn_id': 'iceberg_catalog'}; leave it out for the embedded catalog")
        kind = given.get("type", "embedded")
        if kind not in KINDS:
            raise ConfigurationError(f"iceberg catalog type {kind!r} is not supported; choose one of "
                                     f"{', '.join(KINDS)}")
        name = given.get("name", "iceberg")
        properties = given.get("properties") or {}
        if not isinstance(properties, dict):
            raise ConfigurationError("the iceberg catalog's 'properties' must be a dict of Iceberg catalog properties, "
                                     "e.g. {'s3.endpoint': 'http://minio:9000', 's3.secret-access-key': '...'}")
        props = tuple(sorted((str(k), str(v)) for k, v in properties.items()))
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigurationError(f"iceberg catalog name {name!r} must be a Spark identifier (letters, digits, "
                                     "'_'; not starting with a digit)")
        if kind == "embedded":
            unknown = sorted(set(given) - {"type", "name", "path", "properties"})
            if unknown:
                raise ConfigurationError(f"the embedded iceberg catalog takes 'name', 'path' and 'properties', not "
                                         f"{unknown}; "
                                         "for a PostgreSQL catalog set 'type': 'postgres'")
            path = given.get("path") or (os.path.join(local, EMBEDDED_FILE) if local else None)
            if not path or not os.path.isabs(str(path)):
                raise ConfigurationError("the embedded iceberg catalog is a SQLite file under a local warehouse; "
                                         f"with warehouse {warehouse!r} give catalog 'path' (an absolute file path) "
                                         "or use a PostgreSQL catalog ({'type': 'postgres', 'conn_id': ...})")
            return cls(name, kind, warehouse, f"sqlite:///{path}", props)
        if bool(given.get("conn_id")) == bool(given.get("url")):
            raise ConfigurationError("a postgres iceberg catalog needs exactly one of 'conn_id' (an Airflow postgres "
                                     "connection, recommended: the spec is stored in the ledger) or 'url' "
                                     "('postgresql://user@host:5432/db')")
        if given.get("url") and urlsplit(str(given["url"])).scheme not in _PG_SCHEMES:
            raise ConfigurationError(f"the iceberg catalog url must start with postgresql://, not {given['url']!r}")
        return cls(name, kind, warehouse, str(given.get("url") or f"conn:{given['conn_id']}"), props)

    # -- the database --------------------------------------------------------------

    def database_url(self) -> str:
        """The catalog database as SQLAlchemy reads it (an Airflow connection resolved here, at run time)."""
        url = self.url
        if url.startswith("conn:"):
            url = _connection_url(url[len("conn:"):])
        if url.startswith(("postgresql://", "postgres://")):
            url = "postgresql+psycopg2://" + url.split("://", 1)[1]
        return url

    def describe(self) -> str:
        """The catalog without its password, for messages."""
        if self.url.startswith("conn:"):
            return f"catalog {self.name!r} (PostgreSQL, Airflow connection {self.url[5:]!r})"
        if self.kind == "embedded":
            return f"catalog {self.name!r} (SQLite file {self.url[len('sqlite:///'):]})"
        parts = urlsplit(self.url)
        return f"catalog {self.name!r} (PostgreSQL {parts.hostname}:{parts.port or 5432}{parts.path})"

    def prepare(self) -> None:
        """The embedded catalog's SQLite file in WAL mode, before any client opens it.

        Java's JdbcCatalog keeps a read transaction open on its pooled connection; in SQLite's
        default journal mode that blocks every other writer (pyiceberg's commit) for as long as
        the Spark session lives. In WAL mode readers never block the writer.
        """
        if self.kind != "embedded":
            return
        import sqlite3

        path = self.url[len("sqlite:///"):]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        connection = sqlite3.connect(path, timeout=30)
        try:
            if connection.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                connection.execute("PRAGMA journal_mode=WAL")
        finally:
            connection.close()

    # -- Spark (the write) ---------------------------------------------------------

    def jdbc_package(self) -> str:
        return SQLITE_JDBC_PACKAGE if self.kind == "embedded" else POSTGRES_JDBC_PACKAGE

    def spark_conf(self) -> dict[str, str]:
        """Session settings that make the catalog `name` Iceberg's JdbcCatalog on the same database."""
        prefix = f"spark.sql.catalog.{self.name}"
        # The catalog tables are created by pyiceberg (CatalogSpec.load): Java's JdbcCatalog would check them
        # through a DatabaseMetaData result it leaves open, which pins an SQLite read snapshot for the session's
        # life (its later commits then fail with SQLITE_BUSY_SNAPSHOT once pyiceberg has committed).
        conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.type": "jdbc",
                f"{prefix}.warehouse": self.warehouse, f"{prefix}.jdbc.init-catalog-tables": "false",
                # Always the catalog's current metadata: pyiceberg commits from other processes.
                f"{prefix}.cache-enabled": "false", **{f"{prefix}.{k}": v for k, v in self.properties}}
        if self.kind == "embedded":
            conf[f"{prefix}.uri"] = "jdbc:sqlite:" + self.url[len("sqlite:///"):]
            return conf
        from sqlalchemy.engine import make_url

        url = make_url(self.database_url())
        conf[f"{prefix}.uri"] = f"jdbc:postgresql://{url.host or 'localhost'}:{url.port or 5432}/{url.database}"
        if url.username:
            conf[f"{prefix}.jdbc.user"] = url.username
        if url.password:
            conf[f"{prefix}.jdbc.password"] = str(url.password)
        return conf

    # -- pyiceberg (the commit) ----------------------------------------------------

    def load(self) -> Any:
        """pyiceberg's SqlCatalog on the same rows; raises SinkError (retriable) when unreachable."""
        try:
            from pyiceberg.catalog.sql import SqlCatalog
        except ImportError as exc:
            raise MissingExtraError("the iceberg sink", "iceberg", exc.name) from exc
        self.prepare()
        try:
            return SqlCatalog(self.name, **{**dict(self.properties), "uri": self.database_url(),
                                            "warehouse": self.warehouse})
        except ImportError as exc:  # psycopg2 for a PostgreSQL catalog
            raise MissingExtraError("the iceberg sink's PostgreSQL catalog", "iceberg", exc.name) from exc
        except Exception as exc:
            raise unreachable(self, exc) from exc


def unreachable(catalog: CatalogSpec, exc: Exception) -> SinkError:
    return SinkError(f"cannot reach the Iceberg {catalog.describe()}: {type(exc).__name__}: {str(exc)[:300]}. "
                     "Check that the database is up and that the sink's catalog conn_id/url points at it",
                     retriable=True)


def _connection_url(conn_id: str) -> str:
    from airflow_exactly_once.airflow_integration.connections import postgres_connection_url

    return postgres_connection_url(conn_id, "the iceberg catalog", "give the catalog a 'url'")
