"""Where the Iceberg table lives: one catalog, seen the same way by Spark (the write) and pyiceberg (the commit).

Three kinds; the committer needs no Spark for any of them:

* `embedded` (the default, no server): Iceberg's JDBC catalog on a SQLite file under the warehouse
  folder (the `iceberg_tables` rows that Java's JdbcCatalog and pyiceberg's SqlCatalog share);
* `postgres` (production): the same JDBC catalog on a PostgreSQL database, from an Airflow
  `postgres` connection (`conn_id`) or a `url`;
* `rest` (a platform's catalog: Polaris, Glue, Unity, Nessie, Lakekeeper, Gravitino, ...): Iceberg's
  REST catalog protocol at a `uri` (or an Airflow connection's host), with Iceberg's own REST
  catalog properties (`warehouse`, `credential` or `token`, `header.<name>`, `oauth2-server-uri`,
  `scope`, ...) given alike to pyiceberg's RestCatalog and to Spark's SparkCatalog with `type=rest`.

The catalog's `name` is the catalog name in Spark (`<name>.<namespace>.<table>`) and in the
catalog's rows: other Spark jobs reading the table must use the same name.

A warehouse on object storage (`s3://`, or an `aws_conn_id`) adds the FileIO settings of both clients
(sinks.iceberg.file_io), resolved when a client is made, never kept in the spec.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError, MissingExtraError, SinkError
from airflow_exactly_once.storage.object_location import (SUPPORTED_SCHEMES, is_object_storage, parse_object_location,
                                                       scheme_of)
from airflow_exactly_once.sinks.iceberg.file_io import AWS_BUNDLE_PACKAGE, WarehouseStorage

# The JDBC drivers Spark's JdbcCatalog needs, resolved by Spark like its other connectors.
SQLITE_JDBC_PACKAGE = "org.xerial:sqlite-jdbc:3.50.3.0"
POSTGRES_JDBC_PACKAGE = "org.postgresql:postgresql:42.7.4"
EMBEDDED_FILE = "_iceberg_catalog.sqlite"
KINDS = ("embedded", "postgres", "rest")
# The keys of a REST catalog's dict; `credential`, `token` and `headers` become Iceberg's `credential`, `token`
# and `header.<name>` properties.
REST_KEYS = ("type", "name", "uri", "conn_id", "warehouse", "credential", "token", "headers", "properties")
# Iceberg's REST client timeouts (its HTTPClient's property names), set for both clients unless given.
REST_TIMEOUTS = {"rest.client.connection-timeout-ms": "10000", "rest.client.socket-timeout-ms": "60000"}
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
    # A URI (embedded, postgres); for a REST catalog the warehouse it serves, as it names it ("" when not given)
    warehouse: str
    # SQLAlchemy URL of the catalog database (may hold a password); a REST catalog's uri; "conn:<id>" for an Airflow
    # connection
    url: str = field(repr=False)
    # Iceberg catalog properties (FileIO settings such as s3.endpoint, s3.secret-access-key; a REST catalog's
    # credential, token, header.<name>), given to pyiceberg and to Spark's catalog alike; their secrets are declared
    # by the spec (IcebergSpec.catalog's secret_keys) and never shown here.
    properties: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # The warehouse's object storage (None: a disk): its FileIO settings join `properties` for each client.
    storage: WarehouseStorage | None = None

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> "CatalogSpec":
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
        if kind == "rest":
            return cls._rest(spec, given, name, dict(props))
        warehouse, local = _warehouse(spec.get("warehouse"))
        storage = WarehouseStorage.of(spec, warehouse, dict(props))
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
            return cls(name, kind, warehouse, f"sqlite:///{path}", props, storage)
        if bool(given.get("conn_id")) == bool(given.get("url")):
            raise ConfigurationError("a postgres iceberg catalog needs exactly one of 'conn_id' (an Airflow postgres "
                                     "connection, recommended: the spec is stored in the ledger) or 'url' "
                                     "('postgresql://user@host:5432/db')")
        if given.get("url") and urlsplit(str(given["url"])).scheme not in _PG_SCHEMES:
            raise ConfigurationError(f"the iceberg catalog url must start with postgresql://, not {given['url']!r}")
        return cls(name, kind, warehouse, str(given.get("url") or f"conn:{given['conn_id']}"), props, storage)

    @classmethod
    def _rest(cls, spec: dict[str, Any], given: dict[str, Any], name: str, properties: dict[str, str]) -> "CatalogSpec":
        """A REST catalog: its uri (or connection), the warehouse it serves, and its properties."""
        unknown = sorted(set(given) - set(REST_KEYS))
        if unknown:
            raise ConfigurationError(f"a rest iceberg catalog takes {', '.join(REST_KEYS[1:])}, not {unknown}; other "
                                     "Iceberg REST catalog properties (oauth2-server-uri, scope, ...) go in "
                                     "'properties'")
        if bool(given.get("uri")) == bool(given.get("conn_id")):
            raise ConfigurationError("a rest iceberg catalog needs exactly one of 'uri' (the catalog's base URL, e.g. "
                                     "'http://catalog:8181') or 'conn_id' (an Airflow connection: host = the uri, "
                                     "password = the token, or login + password = the credential)")
        uri = str(given.get("uri") or "")
        if uri and urlsplit(uri).scheme not in ("http", "https"):
            raise ConfigurationError(f"the rest iceberg catalog's uri must be an http:// or https:// URL, not {uri!r}")
        if given.get("credential") and given.get("token"):
            raise ConfigurationError("give a rest iceberg catalog a 'credential' (OAuth2 client id:secret, exchanged "
                                     "for a token) or a 'token', not both")
        headers = given.get("headers") or {}
        if not isinstance(headers, dict):
            raise ConfigurationError("the rest iceberg catalog's 'headers' must be a dict of HTTP headers, e.g. "
                                     "{'X-Tenant': 'analytics'}")
        inline = {**{f"header.{k}": str(v) for k, v in headers.items()},
                  **{k: str(given[k]) for k in ("credential", "token") if given.get(k)}}
        warehouse = _rest_warehouse(spec.get("warehouse"), given.get("warehouse"))
        merged = {**REST_TIMEOUTS, **properties, **inline}
        on_s3 = warehouse if scheme_of(warehouse) in SUPPORTED_SCHEMES else ""  # else a name its server serves
        return cls(name, "rest", warehouse, uri or f"conn:{given['conn_id']}", tuple(sorted(merged.items())),
                   WarehouseStorage.of(spec, on_s3, properties))

    def client_properties(self, client: str) -> dict[str, str]:
        """The spec's catalog properties as `client` ("spark" or "pyiceberg") gets them: with the FileIO settings of
        a warehouse on object storage, its credentials read now."""
        if self.storage is None:
            return dict(self.properties)
        return self.storage.client_properties(dict(self.properties), client)

    def check_storage(self, location: str | None = None) -> None:
        """A warehouse on object storage: its bucket (or that of the table's `location`) there, the credentials
        accepted; a ConfigurationError naming the fix otherwise."""
        if self.storage is None:
            return
        bucket = (parse_object_location(location, "the iceberg table's location").bucket
                  if location and is_object_storage(location) else None)
        self.storage.check(dict(self.properties), bucket)

    # -- a REST catalog ------------------------------------------------------------

    def rest_properties(self, client: str = "pyiceberg") -> dict[str, str]:
        """Iceberg's REST catalog properties of `client` (an Airflow connection resolved here, at run time)."""
        properties = self.client_properties(client)
        if self.url.startswith("conn:"):
            properties.update(_rest_connection(self.url[len("conn:"):]))
        else:
            properties["uri"] = self.url
        if self.warehouse:
            properties["warehouse"] = self.warehouse
        return properties

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
        if self.kind == "rest":
            where = (f"Airflow connection {self.url[5:]!r}" if self.url.startswith("conn:")
                     else urlsplit(self.url)._replace(query="", fragment="").geturl())
            return f"REST catalog {self.name!r} ({where}{f', warehouse {self.warehouse!r}' if self.warehouse else ''})"
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

    def jdbc_package(self) -> str | None:
        """The JDBC driver Spark needs for the catalog (none for a REST catalog)."""
        if self.kind == "rest":
            return None
        return SQLITE_JDBC_PACKAGE if self.kind == "embedded" else POSTGRES_JDBC_PACKAGE

    def file_io_package(self) -> str | None:
        """The AWS SDK bundle Spark's S3FileIO needs (a warehouse on object storage), else None."""
        return AWS_BUNDLE_PACKAGE if self.storage is not None else None

    def spark_conf(self) -> dict[str, str]:
        """Session settings that make the catalog `name` the same catalog as pyiceberg's: Iceberg's JdbcCatalog on the
        same database, or its RESTCatalog (`type=rest`) with the same properties."""
        prefix = f"spark.sql.catalog.{self.name}"
        if self.kind == "rest":
            # Always the catalog's current metadata: pyiceberg commits from other processes.
            return {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.type": "rest",
                    f"{prefix}.cache-enabled": "false",
                    **{f"{prefix}.{k}": v for k, v in sorted(self.rest_properties("spark").items())}}
        # The catalog tables are created by pyiceberg (CatalogSpec.load): Java's JdbcCatalog would check them
        # through a DatabaseMetaData result it leaves open, which pins an SQLite read snapshot for the session's
        # life (its later commits then fail with SQLITE_BUSY_SNAPSHOT once pyiceberg has committed).
        conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", f"{prefix}.type": "jdbc",
                f"{prefix}.warehouse": self.warehouse, f"{prefix}.jdbc.init-catalog-tables": "false",
                # Always the catalog's current metadata: pyiceberg commits from other processes.
                f"{prefix}.cache-enabled": "false",
                **{f"{prefix}.{k}": v for k, v in sorted(self.client_properties("spark").items())}}
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
        """pyiceberg's catalog (SqlCatalog on the same rows, or RestCatalog); SinkError (retriable) when unreachable."""
        if self.kind == "rest":
            return self._load_rest()
        try:
            from pyiceberg.catalog.sql import SqlCatalog
        except ImportError as exc:
            raise MissingExtraError("the iceberg sink", "iceberg", exc.name) from exc
        self.prepare()
        try:
            return SqlCatalog(self.name, **{**self.client_properties("pyiceberg"), "uri": self.database_url(),
                                            "warehouse": self.warehouse})
        except ImportError as exc:  # psycopg2 for a PostgreSQL catalog
            raise MissingExtraError("the iceberg sink's PostgreSQL catalog", "iceberg", exc.name) from exc
        except Exception as exc:
            raise unreachable(self, exc) from exc

    def _load_rest(self) -> Any:
        try:
            from airflow_exactly_once.sinks.iceberg import rest_client
        except ImportError as exc:
            raise MissingExtraError("the iceberg sink's REST catalog", "iceberg", exc.name) from exc
        properties = self.rest_properties("pyiceberg")
        try:
            return rest_client.open_catalog(self.name, properties)
        except Exception as exc:
            raise catalog_failure(self, exc, connecting=True) from exc

    def where(self) -> str:
        """The catalog's address for messages: a REST catalog's uri, else its description."""
        if self.kind == "rest" and not self.url.startswith("conn:"):
            return urlsplit(self.url)._replace(query="", fragment="").geturl()
        return self.describe()


def catalog_failure(catalog: CatalogSpec, exc: Exception, table: str | None = None,
                    connecting: bool = False) -> ExactlyOnceError:
    """What a catalog error means: refused credentials, a warehouse not served, or an unreachable catalog (the
    default: retriable)."""
    return rest_failure(catalog, exc, table, connecting=connecting) or unreachable(catalog, exc)


def rest_failure(catalog: CatalogSpec, exc: Exception, table: str | None = None, committing: str | None = None,
                 connecting: bool = False) -> ExactlyOnceError | None:
    """What a REST catalog's error means (an unknown outcome when `committing`), None for another catalog's or an
    error that is not the catalog's."""
    if catalog.kind != "rest":
        return None
    from airflow_exactly_once.sinks.iceberg import rest_client

    return rest_client.failure(exc, uri=catalog.where(), warehouse=catalog.warehouse or None, table=table,
                               committing=committing, connecting=connecting)


def unreachable(catalog: CatalogSpec, exc: Exception) -> SinkError:
    if catalog.kind == "rest":
        return SinkError(f"cannot reach the Iceberg {catalog.describe()}: {type(exc).__name__}: {str(exc)[:300]}. "
                         "Check that the catalog server is up and that the sink's catalog 'uri' (or conn_id) points at "
                         "it", retriable=True)
    return SinkError(f"cannot reach the Iceberg {catalog.describe()}: {type(exc).__name__}: {str(exc)[:300]}. "
                     "Check that the database is up and that the sink's catalog conn_id/url points at it",
                     retriable=True)


def _rest_warehouse(top: Any, inside: Any) -> str:
    """A REST catalog's warehouse: the sink's `warehouse` or the catalog's, the same when both are given."""
    for value in (top, inside):
        if value is not None and not isinstance(value, str):
            raise ConfigurationError(f"the rest iceberg catalog's warehouse must be text (its name or location), not "
                                     f"{value!r}")
    if top and inside and top != inside:
        raise ConfigurationError(f"the iceberg sink's 'warehouse' ({top!r}) and its catalog's ({inside!r}) differ; "
                                 "give the warehouse the REST catalog serves once")
    return str(top or inside or "")


def _rest_connection(conn_id: str) -> dict[str, str]:
    from airflow_exactly_once.airflow_integration.connections import rest_catalog_properties

    return rest_catalog_properties(conn_id, "the iceberg catalog")


def _connection_url(conn_id: str) -> str:
    from airflow_exactly_once.airflow_integration.connections import postgres_connection_url

    return postgres_connection_url(conn_id, "the iceberg catalog", "give the catalog a 'url'")
