"""Airflow connections as the clients need them: SQLAlchemy URLs (the ledger's connection, the `postgres`
connections of sinks) and S3 settings (the `aws` connections of sinks that write to object storage).

Below the hooks and the sinks alike, so a sink that names a connection (`conn_id`) resolves
it without importing a hook; Airflow itself is imported only when a connection is read.
"""

from __future__ import annotations

from airflow_exactly_once.airflow_integration.compat import BaseHook
from airflow_exactly_once.airflow_integration.provider_info import LEDGER_CONN_TYPE
from airflow_exactly_once.core.errors import ConfigurationError


def connection_to_url(conn) -> str:
    """A SQLAlchemy URL from an `exactly_once_ledger`, `postgres`, `sqlite` or generic Airflow connection."""
    if conn.conn_type == LEDGER_CONN_TYPE:
        return ledger_connection_url(conn)
    if conn.conn_type == "sqlite":
        return f"sqlite:///{conn.host}"
    if conn.conn_type in ("postgres", "postgresql"):
        return _postgres_url(conn)
    uri = conn.extra_dejson.get("sqlalchemy_url") or conn.get_uri()
    return uri.replace("postgres://", "postgresql+psycopg2://", 1)


def postgres_connection_url(conn_id: str, user: str, instead: str) -> str:
    """The SQLAlchemy URL of the Airflow `postgres` connection `conn_id` that `user` (e.g. "the postgres sink")
    reads; errors say to create it, or to do `instead` (e.g. "give the sink a 'url'")."""
    conn = _read_connection(conn_id, user, "(conn_type 'postgres': host, port, login, password, schema = database)",
                            instead)
    if conn.conn_type not in ("postgres", "postgresql"):
        raise ConfigurationError(f"connection {conn_id!r} is of type {conn.conn_type!r}; {user} needs a 'postgres' "
                                 "connection")
    return connection_to_url(conn)


def aws_connection_settings(conn_id: str, user: str) -> dict[str, str]:
    """boto3's client settings from the Airflow `aws` connection `conn_id` that `user` (e.g. "the parquet sink")
    reads, as the Amazon provider stores them (that provider need not be installed): login = access key id,
    password = secret access key, extras `endpoint_url`, `region_name`, `aws_session_token` (also under the
    provider's older names). Only what the connection gives: boto3's own chain fills in the rest."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:
        raise ConfigurationError(f"{user}'s Airflow connection {conn_id!r} cannot be read ({exc}); create it "
                                 "(conn_type 'aws': login = access key id, password = secret access key, extra "
                                 '{"endpoint_url": ..., "region_name": ...}) or leave aws_conn_id out to use the '
                                 "worker's own AWS credentials") from exc
    if conn.conn_type not in AWS_CONN_TYPES:
        raise ConfigurationError(f"connection {conn_id!r} is of type {conn.conn_type!r}; {user} needs an 'aws' "
                                 "connection")
    extra = conn.extra_dejson
    endpoint = extra.get("endpoint_url") or extra.get("host") or (extra.get("service_config") or {}).get(
        "s3", {}).get("endpoint_url")
    settings = {"aws_access_key_id": conn.login or extra.get("aws_access_key_id"),
                "aws_secret_access_key": conn.password or extra.get("aws_secret_access_key"),
                "aws_session_token": extra.get("aws_session_token"),
                "endpoint_url": endpoint, "region_name": extra.get("region_name")}
    return {key: str(value) for key, value in settings.items() if value}


# The Amazon provider's connection type, and the older name S3 connections had.
AWS_CONN_TYPES = ("aws", "s3")


def ledger_connection_url(conn) -> str:
    """The URL of an `exactly_once_ledger` connection (see docs/install.md, "The ledger connection").

    Host holds either a full SQLAlchemy URL (Login and Password fill in its user and password
    when it has none, so the password can stay in Airflow's masked field), or the server's
    host name: then the `backend` extra says which database, postgresql (the default: Port,
    Login, Password, Schema = database, libpq extras such as sslmode) or sqlite (Host is the
    database file).
    """
    host = (conn.host or "").strip()
    if "://" in host:
        return _with_credentials(_checked_url(host, conn.conn_id), conn.login, conn.password)
    extra = conn.extra_dejson
    backend = str(extra.get("backend") or extra.get(f"extra__{LEDGER_CONN_TYPE}__backend") or "postgresql").lower()
    if backend == "sqlite":
        if not host:
            raise ConfigurationError(f"ledger connection {conn.conn_id!r} (backend sqlite) has no Host: set Host to "
                                     "the database file, e.g. /var/lib/airflow/exactly_once_ledger.db")
        return f"sqlite:///{host}"
    if backend not in ("postgresql", "postgres"):
        raise ConfigurationError(f"ledger connection {conn.conn_id!r} has backend {backend!r}: set the extra "
                                 '"backend" to "postgresql" or "sqlite", or put a full SQLAlchemy URL in Host')
    return _postgres_url(conn)


def _checked_url(url: str, conn_id: str | None) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(url)
    except ArgumentError as exc:
        raise ConfigurationError(f"ledger connection {conn_id!r}: Host {url!r} is not a SQLAlchemy URL ({exc}); "
                                 "write e.g. postgresql+psycopg2://user@db:5432/ledger") from exc
    return url


def _with_credentials(url: str, login: str | None, password: str | None) -> str:
    """`url` with the connection's login and password, where the URL itself names no user."""
    from urllib.parse import quote, urlsplit

    if not login or urlsplit(url).username is not None:
        return url
    scheme, rest = url.split("://", 1)
    auth = quote(login, safe="") + (f":{quote(password, safe='')}" if password else "")
    return f"{scheme}://{auth}@{rest}"


def _postgres_url(conn) -> str:
    auth = conn.login or ""
    if conn.password:
        from urllib.parse import quote

        auth += f":{quote(conn.password, safe='')}"
    auth += "@" if auth else ""
    port = f":{conn.port}" if conn.port else ""
    return (f"postgresql+psycopg2://{auth}{conn.host or '127.0.0.1'}{port}/{conn.schema or 'postgres'}"
            + _libpq_query(conn.extra_dejson))


# Connection extras that are libpq parameters (TLS, timeouts, session options) travel in the URL.
LIBPQ_EXTRAS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout", "application_name",
                "options", "target_session_attrs", "keepalives", "keepalives_idle")


def _libpq_query(extra: dict) -> str:
    from urllib.parse import quote, urlencode

    params = {k: str(extra[k]) for k in LIBPQ_EXTRAS if extra.get(k) not in (None, "")}
    return f"?{urlencode(params, quote_via=quote)}" if params else ""  # %20, not +: libpq reads URLs too


def rest_catalog_properties(conn_id: str, user: str) -> dict[str, str]:
    """Iceberg REST catalog properties from a generic or HTTP Airflow connection that `user` reads: host = the
    catalog's uri (or host, port, schema), password = the token, or login + password = the OAuth2 credential
    (`client_id:client_secret`); extra `warehouse`, `headers` and `properties` (further Iceberg properties)."""
    conn = _read_connection(conn_id, user, "(conn_type 'http' or 'generic': host = the catalog's uri, password = its "
                                           "token)", "give the catalog a 'uri'")
    host = conn.host or ""
    if "://" not in host:
        scheme = conn.schema if conn.schema in ("http", "https") else "http"
        host = f"{scheme}://{host}{f':{conn.port}' if conn.port else ''}"
    extra = conn.extra_dejson or {}
    properties = {"uri": host, **{str(k): str(v) for k, v in (extra.get("properties") or {}).items()},
                  **{f"header.{k}": str(v) for k, v in (extra.get("headers") or {}).items()}}
    if extra.get("warehouse"):
        properties["warehouse"] = str(extra["warehouse"])
    if conn.password:
        properties["credential" if conn.login else "token"] = (f"{conn.login}:{conn.password}" if conn.login
                                                               else conn.password)
    return properties


def _read_connection(conn_id: str, user: str, create: str, instead: str):
    """The Airflow connection `conn_id`; an error that says how to `create` it, or to do `instead`."""
    try:
        return BaseHook.get_connection(conn_id)
    except Exception as exc:
        raise ConfigurationError(f"{user}'s Airflow connection {conn_id!r} cannot be read ({exc}); create it {create} "
                                 f"or {instead}") from exc
