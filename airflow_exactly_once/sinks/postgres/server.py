"""Reaching the PostgreSQL server: connections from a DSN or URL, statements run on them, the check that the
server can prepare transactions at all, and tables created once, safely against a concurrent creator.

Every two-phase step opens its own short connection (autocommit, so that it begins, prepares and
commits explicitly) and closes it quietly, so a step runs in any process from the DSN alone. Only
psycopg2 is needed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from airflow_exactly_once.sinks.postgres.driver import psycopg2, sql
from airflow_exactly_once.sinks.postgres.errors import (
    PostgresTransactionError,
    is_retriable,
    server_message,
    two_phase_error,
)


__all__ = [
    "check_two_phase_supported",
    "create_table_if_missing",
    "query",
    "connect",
    "describe_dsn",
]


# -- connections ---------------------------------------------------------------------


def _libpq_dsn(dsn: str) -> str:
    """Accept SQLAlchemy URLs (``postgresql+psycopg2://``) as well as libpq DSNs."""
    return re.sub(r"^postgres(?:ql)?\+\w+://", "postgresql://", dsn)


def describe_dsn(dsn: str) -> str:
    """``user@host:port/dbname`` without the password, for error messages."""
    try:
        params = psycopg2.extensions.parse_dsn(_libpq_dsn(dsn))
    except psycopg2.Error:
        return "<unparsable DSN>"
    return (f"{params.get('user', '')}@{params.get('host', 'localhost')}:{params.get('port', '5432')}"
            f"/{params.get('dbname', '')}")


def connect(dsn: str) -> psycopg2.extensions.connection:
    libpq = _libpq_dsn(dsn)
    extra = {} if "connect_timeout" in libpq else {"connect_timeout": 10}
    try:
        conn = psycopg2.connect(libpq, **extra)
    except psycopg2.OperationalError as exc:
        raise PostgresTransactionError(
            f"Could not connect to PostgreSQL at {describe_dsn(dsn)}: {str(exc).strip()}",
            retriable=True,
        ) from exc
    conn.autocommit = True  # transactions are begun explicitly, so PREPARE/COMMIT PREPARED can run
    return conn


def close_quietly(conn: psycopg2.extensions.connection) -> None:
    try:
        if not conn.closed and conn.info.transaction_status != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
            conn.cursor().execute("ROLLBACK")
    except psycopg2.Error:
        pass
    try:
        conn.close()
    except psycopg2.Error:
        pass


def with_cursor(conn_or_dsn, fn):
    """Run ``fn(cursor)`` on a connection we open and close, or on the caller's connection."""
    if isinstance(conn_or_dsn, str):
        conn = connect(conn_or_dsn)
        try:
            with conn.cursor() as cur:
                return fn(cur)
        finally:
            conn.close()
    conn = conn_or_dsn
    was_idle = conn.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    with conn.cursor() as cur:
        result = fn(cur)
    if was_idle and not conn.autocommit:
        conn.commit()  # end the transaction our statements opened
    return result


# -- server checks and statements ----------------------------------------------------


def check_two_phase_supported(conn_or_dsn) -> int:
    """Return the server's ``max_prepared_transactions``; raise TwoPhaseNotSupported if it is 0.

    ``conn_or_dsn`` is a psycopg2 connection or a DSN / URL string.
    """
    def show(cur) -> tuple[int, str]:
        cur.execute("SELECT current_setting('max_prepared_transactions')::int, "
                    "coalesce(host(inet_server_addr()), 'local socket') || ':' || current_setting('port')")
        return cur.fetchone()

    value, where = with_cursor(conn_or_dsn, show)
    if value <= 0:
        raise two_phase_error(where if not isinstance(conn_or_dsn, str) else describe_dsn(conn_or_dsn), value)
    return value


def query(dsn: str, statement: str, params: tuple = ()) -> list[tuple]:
    """One statement in its own connection; its rows. Errors say which server and whether a retry can help."""
    def run(cur) -> list[tuple]:
        cur.execute(statement, params)
        return cur.fetchall() if cur.description else []

    try:
        return with_cursor(dsn, run)
    except psycopg2.Error as exc:
        raise PostgresTransactionError(f"{describe_dsn(dsn)}: {server_message(exc)}",
                                       retriable=is_retriable(exc)) from exc


# -- creating tables -----------------------------------------------------------------


def table_identifier(table: str | Sequence[str]) -> sql.Identifier:
    if isinstance(table, str):
        parts = table.split(".", 1)
    else:
        parts = list(table)
    if not 1 <= len(parts) <= 2 or not all(isinstance(p, str) and p for p in parts):
        raise ValueError(f"table must be 'name', 'schema.name' or ('schema', 'name'), not {table!r}")
    return sql.Identifier(*parts)


def create_table_if_missing(dsn: str, table: str, column_types: dict[str, str]) -> None:
    """CREATE TABLE IF NOT EXISTS ``table`` with ``column_types`` ({name: SQL type}), committed."""
    columns = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind))
                                 for name, kind in column_types.items())

    def create(cur) -> None:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (table_identifier(table).as_string(cur),))
        if cur.fetchone()[0]:
            return
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(table_identifier(table), columns))
        cur.connection.commit()

    try:
        create_if_missing(dsn, create)
    except psycopg2.Error as exc:
        raise PostgresTransactionError(f"creating {table} on {describe_dsn(dsn)}: {server_message(exc)}",
                                       retriable=is_retriable(exc)) from exc


def create_if_missing(conn_or_dsn, create: Callable[[Any], None]) -> None:
    for attempt in range(3):
        try:
            with_cursor(conn_or_dsn, create)
            return
        except psycopg2.errors.UniqueViolation:
            # Two sessions ran CREATE ... IF NOT EXISTS at once; the other one won.
            if not isinstance(conn_or_dsn, str):
                conn_or_dsn.rollback()
            if attempt == 2:
                raise
