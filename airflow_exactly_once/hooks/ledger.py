"""Where the offset ledger lives, from an Airflow connection, a URL, or the embedded default."""

from __future__ import annotations

import os
from pathlib import Path

from airflow_exactly_once.compat import BaseHook
from airflow_exactly_once.core.ledger import Ledger

EMBEDDED_LEDGER_FILE = "exactly_once_ledger.db"


def embedded_ledger_url() -> str:
    """The embedded default: a SQLite file beside Airflow's own files."""
    home = os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))
    return f"sqlite:///{Path(home) / EMBEDDED_LEDGER_FILE}"


def connection_to_url(conn) -> str:
    """A SQLAlchemy URL from a `postgres`, `sqlite` or generic Airflow connection."""
    if conn.conn_type == "sqlite":
        return f"sqlite:///{conn.host}"
    if conn.conn_type in ("postgres", "postgresql"):
        auth = conn.login or ""
        if conn.password:
            from urllib.parse import quote

            auth += f":{quote(conn.password, safe='')}"
        auth += "@" if auth else ""
        port = f":{conn.port}" if conn.port else ""
        return (f"postgresql+psycopg2://{auth}{conn.host or '127.0.0.1'}{port}/{conn.schema or 'postgres'}"
                + _libpq_query(conn.extra_dejson))
    uri = conn.extra_dejson.get("sqlalchemy_url") or conn.get_uri()
    return uri.replace("postgres://", "postgresql+psycopg2://", 1)


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
    conn_type = "exactly_once_ledger"
    hook_name = "Exactly-once offset ledger"

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

