"""Connections to the ledger database: SQLite serialised like PostgreSQL, and read-only readers.

Kept apart from the tables because what a connection must do (take SQLite's write lock up front,
refuse to write for the ledger page and the trigger) is a concern of its own.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Any, Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from airflow_exactly_once.core.errors import ConfigurationError, MissingExtraError


def redacted_url(url: str) -> str:
    """A ledger's URL without its password: what the ledger page and the CLI show of the ledger they read."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "(not a SQLAlchemy URL)"


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


@contextmanager
def read_connection(engine: Engine) -> Iterator[Connection]:
    """A connection for statements that only read, without a transaction where that changes nothing.

    PostgreSQL at READ COMMITTED (its default): each statement sees what was committed before it began, inside
    a transaction or not, so reads run in autocommit mode and save the BEGIN and the ROLLBACK, two of a read's
    three round trips. Under a stricter isolation level, whose transactions share one snapshot between their
    statements, and on SQLite, whose every transaction takes the write lock (create_ledger_engine) and so
    serialises a read with the writers, reads keep their transaction. Every compare-and-set and every read
    inside one stays in a write transaction (engine.begin()), as before.
    """
    with engine.connect() as conn:
        dialect = conn.dialect
        if not (dialect.name == "postgresql" and dialect.driver == "psycopg2"
                and dialect.default_isolation_level == "READ COMMITTED"):
            yield conn
            return
        # psycopg2's own switch, not SQLAlchemy's isolation_level option: resetting that one on the way back to
        # the pool sends a SET, a round trip of its own, where turning autocommit off again sends nothing.
        dbapi_conn = conn.connection.dbapi_connection
        if dbapi_conn is None:  # invalidated: SQLAlchemy connects again, with its own transactions
            yield conn
            return
        dbapi_conn.autocommit = True
        try:
            yield conn
        finally:
            if not dbapi_conn.closed:  # a connection lost meanwhile is discarded by the pool
                dbapi_conn.autocommit = False


def _server_engine(url: str, **options: Any) -> Engine:
    """An engine on a database server (PostgreSQL); a driver missing for want of the extra says which extra."""
    if sa.engine.make_url(url).get_driver_name() == "psycopg2":
        # The ledger has no hstore column: without this psycopg2 looks hstore up on every new connection, three
        # round trips of every task process (each opens its own engine).
        options.setdefault("use_native_hstore", False)
    try:
        engine = sa.create_engine(url, **options)
    except ModuleNotFoundError as exc:  # the URL's driver, e.g. psycopg2 without the [postgres] extra
        if exc.name != "psycopg2":
            raise
        raise MissingExtraError("a PostgreSQL ledger", "postgres", exc.name) from exc
    _ping_when_idle(engine)
    return engine


# A pooled connection unused for this long is tested before it is handed out again (see _ping_when_idle).
PING_AFTER_IDLE_S = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """Test a pooled connection before reuse only when it sat idle, and replace it when the server dropped it.

    What pool_pre_ping does, without its round trip on every checkout: a plan checks a connection out a dozen
    times within milliseconds, and with many plans at once on a busy server those pings were a large share of
    the plan's round trips (docs/benchmarks.md, benchmarks/bench_scale.py). A connection the server closed (a restart, an idle timeout)
    has been idle for longer than that, so it is still found and replaced before a statement fails on it.
    """

    @sa.event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_conn, record):  # pragma: no cover - pool hook
        record.info["aeo_idle_since"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_conn, record, _proxy):  # pragma: no cover - pool hook
        since = record.info.pop("aeo_idle_since", None)
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except engine.dialect.loaded_dbapi.Error as exc:  # the pool discards it and connects anew
            raise sa.exc.DisconnectionError(f"the ledger connection was closed while idle: {exc}") from exc
