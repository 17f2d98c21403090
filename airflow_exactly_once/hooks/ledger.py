"""Where the offset ledger lives, from an Airflow connection, a URL, or the embedded default."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow_exactly_once.compat import BaseHook
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.provider_info import LEDGER_CONN_FIELDS, LEDGER_CONN_TYPE, LEDGER_UI_FIELD_BEHAVIOUR

EMBEDDED_LEDGER_FILE = "exactly_once_ledger.db"


def embedded_ledger_url() -> str:
    """The embedded default: a SQLite file beside Airflow's own files."""
    home = os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))
    return f"sqlite:///{Path(home) / EMBEDDED_LEDGER_FILE}"


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
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:
        raise ConfigurationError(f"{user}'s Airflow connection {conn_id!r} cannot be read ({exc}); create it "
                                 "(conn_type 'postgres': host, port, login, password, schema = database) or "
                                 f"{instead}") from exc
    if conn.conn_type not in ("postgres", "postgresql"):
        raise ConfigurationError(f"connection {conn_id!r} is of type {conn.conn_type!r}; {user} needs a 'postgres' "
                                 "connection")
    return connection_to_url(conn)


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


class LedgerHook(BaseHook):
    """The offset ledger of exactly-once pipelines (SQLite or PostgreSQL, through SQLAlchemy)."""

    conn_name_attr = "ledger_conn_id"
    default_conn_name = "exactly_once_ledger_default"
    conn_type = LEDGER_CONN_TYPE
    hook_name = "Exactly-once offset ledger"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form's labels and hints, for Airflow < 3.2 (later ones read the provider info)."""
        return {key.replace("-", "_"): value for key, value in LEDGER_UI_FIELD_BEHAVIOUR.items()}

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The `backend` field of the connection form, for Airflow < 3.2 with the FAB UI installed."""
        from flask_appbuilder.fieldwidgets import BS3TextFieldWidget
        from flask_babel import lazy_gettext
        from wtforms import StringField

        return {name: StringField(lazy_gettext(field["label"]), widget=BS3TextFieldWidget(),
                                  description=field["description"])
                for name, field in LEDGER_CONN_FIELDS.items()}

    def __init__(self, ledger_conn_id: str | None = None, ledger_url: str | None = None) -> None:
        super().__init__()
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url

    def get_url(self) -> str:
        if self.ledger_url:
            return self.ledger_url
        if self.ledger_conn_id:
            return connection_to_url(self.get_connection(self.ledger_conn_id))
        return embedded_ledger_url()

    def get_conn(self) -> Ledger:
        ledger = Ledger(self.get_url())
        ledger.create_schema()
        return ledger

