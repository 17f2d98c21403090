"""Connections to the ledger database: SQLite serialised like PostgreSQL, and read-only readers.

Kept apart from the tables because what a connection must do (take SQLite's write lock up front,
refuse to write for the ledger page and the trigger) is a concern of its own.
"""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from airflow_exactly_once.core.errors import ConfigurationError, MissingExtraError


def create_ledger_engine(url: str, *, read_only: bool = False) -> Engine:
    """An engine whose write transactions serialize properly on SQLite as well.

    `read_only`: for readers that must never write or lock (the ledger page, the trigger): SQLite
    opens the file read-only and never takes its write lock; PostgreSQL sessions are read-only
    and give up connecting after a few seconds.
    """
    if read_only:
        return _read_only_engine(url)
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 60})

        @sa.event.listens_for(engine, "connect")
        def _no_pysqlite_transactions(dbapi_conn, _record):  # pragma: no cover - driver hook
            dbapi_conn.isolation_level = None

        @sa.event.listens_for(engine, "begin")
        def _begin_immediate(conn):  # pragma: no cover - driver hook
            # Take the write lock up front: a read-then-write transaction that upgrades
            # later can fail with "database is locked" regardless of the busy timeout.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return _server_engine(url)


def missing_sqlite_file(url: str) -> bool:
    """A SQLite ledger whose file does not exist yet: nothing was recorded (a reader must not create it)."""
    try:
        parsed = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        return False
    database = parsed.database or ""
    return (parsed.get_backend_name() == "sqlite" and database not in ("", ":memory:")
            and not database.startswith("file:") and not os.path.exists(database))


def _read_only_engine(url: str) -> Engine:
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if not database or database == ":memory:" or database.startswith("file:"):
            raise ConfigurationError(f"a read-only ledger needs a SQLite file, not {database or 'memory'!r}")
        # mode=ro: a missing file is an error (not a new empty ledger) and nothing is ever written.
        return sa.create_engine(f"sqlite:///file:{database}?mode=ro&uri=true", connect_args={"timeout": 10})
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        connect_args["connect_timeout"] = 5
    engine = _server_engine(url, connect_args=connect_args)
    if engine.dialect.name == "postgresql":
        @sa.event.listens_for(engine, "connect")
        def _read_only_session(dbapi_conn, _record):  # pragma: no cover - driver hook
            with dbapi_conn.cursor() as cursor:
                cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            dbapi_conn.commit()
    return engine


def _server_engine(url: str, **options: Any) -> Engine:
    """An engine on a database server (PostgreSQL); a driver missing for want of the extra says which extra."""
    try:
        return sa.create_engine(url, pool_pre_ping=True, **options)
    except ModuleNotFoundError as exc:  # the URL's driver, e.g. psycopg2 without the [postgres] extra
        if exc.name != "psycopg2":
            raise
        raise MissingExtraError("a PostgreSQL ledger", "postgres", exc.name) from exc
