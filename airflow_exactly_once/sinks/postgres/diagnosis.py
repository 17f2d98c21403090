"""Server errors of the two-phase steps turned into messages that name the cause and the fix.

A constraint the rows violate, an upsert key without a unique index, a row lock held past
``lock_timeout``, a prepared transaction of another database or role: the SQLSTATE picks the
explanation, so a failed task says what to change and whether a retry can help, not only what
PostgreSQL said. Apart from the steps (sinks.postgres.prepare, sinks.postgres.commit) because it is
most of their text and none of their protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_exactly_once.sinks.postgres.errors import (
    PostgresTransactionError,
    PrepareFailed,
    is_retriable,
    server_message,
    two_phase_error,
)
from airflow_exactly_once.sinks.postgres.markers import MARKER_TABLE

if TYPE_CHECKING:
    import psycopg2

__all__ = [
    "prepare_failure",
    "finish_error",
]


def prepare_failure(exc: psycopg2.Error, *, gid: str, table: str, mode: str, key_columns: list[str],
                    n_rows: int, where: str, marker_schema: str,
                    lock_timeout: str | None = None) -> PostgresTransactionError:
    """Turn a server error into a message that names the table, the constraint and the fix.

    `lock_timeout` is the session's setting (e.g. "500ms"), read before writing, for a lock wait that ran out."""
    code = exc.pgcode or ""
    diag = exc.diag
    constraint = diag.constraint_name if exc.pgcode else None
    column = diag.column_name if exc.pgcode else None
    server = server_message(exc)
    detail = f" ({diag.message_detail.rstrip('.')})" if exc.pgcode and diag.message_detail else ""
    what, fix = server, "see the server's message above."
    marker = f"{marker_schema}.{MARKER_TABLE}"

    if code == "23505":  # unique_violation
        what = f"unique constraint {constraint!r} on {table} was violated{detail}"
        if mode == "insert":
            fix = (f"the rows duplicate keys that {table} already holds (or each other). Write with "
                   f"mode='upsert' and key_columns set to the columns of {constraint!r} to replace existing "
                   f"rows, or remove the duplicates before writing.")
        else:
            fix = (f"the upsert key {key_columns} is not the key of {constraint!r}, which the rows also "
                   f"violate. Use the columns of {constraint!r} as key_columns, or drop that constraint.")
    elif code == "23502":  # not_null_violation
        what = f"column {column!r} of {table} is NOT NULL and a row has no value for it{detail}"
        fix = (f"supply a value for {column!r} in every row, or allow NULLs "
               f"(ALTER TABLE {table} ALTER COLUMN {column} DROP NOT NULL).")
    elif code == "23503":  # foreign_key_violation
        what = f"foreign key constraint {constraint!r} on {table} was violated{detail}"
        fix = "make sure the referenced rows exist and are committed before this batch, or drop the foreign key."
    elif code == "23514":  # check_violation
        what = f"check constraint {constraint!r} on {table} was violated{detail}"
        fix = f"correct the offending values, or change the check constraint {constraint!r}."
    elif code.startswith("23"):
        what = f"integrity constraint {constraint!r} on {table} was violated: {server}"
        fix = f"correct the data so it satisfies {constraint!r}, or change that constraint."
    elif code == "42P10":  # invalid_column_reference: no unique index for ON CONFLICT
        what = f"{table} has no unique index or constraint on the upsert key {key_columns}"
        fix = (f"create one (CREATE UNIQUE INDEX ON {table} ({', '.join(key_columns)})), "
               f"or pass the columns of an existing unique constraint as key_columns.")
    elif code == "42P01":  # undefined_table
        if MARKER_TABLE in server:
            what = f"the marker table {marker} does not exist"
            fix = f"call ensure_marker_table(conn, schema={marker_schema!r}) once before the writers run."
        else:
            what = f"table {table} does not exist"
            fix = f"create {table} before writing to it (or correct the table name)."
    elif code == "42703":  # undefined_column
        what = f"a column does not exist in {table}: {server}"
        fix = "make the columns written match the table's columns."
    elif code.startswith("22"):  # data exception
        what = f"a value does not fit its column in {table}: {server}"
        fix = "convert the values to the columns' types (or widen the column types) before writing."
    elif code == "55000" and "prepared transactions are disabled" in server:
        return two_phase_error(where)
    elif code == "53200":
        what = "the server's limit of prepared transactions (max_prepared_transactions) is reached"
        fix = ("commit or roll back prepared transactions left behind (rollback_prepared_matching), or raise "
               "max_prepared_transactions in postgresql.conf above the number of partitions written at once "
               "and restart the server.")
    elif code == "55P03":  # lock_not_available: lock_timeout ran out
        what = (f"a row lock on {table} was not granted within lock_timeout={lock_timeout or '?'} (the postgres "
                f"sink's lock_timeout_ms): another transaction holds locks on keys these rows write ({server})")
        fix = ("end the transaction that holds them: a prepared one (SELECT gid, prepared FROM pg_prepared_xacts) "
               "with COMMIT PREPARED or ROLLBACK PREPARED by whoever owns it, a session's through "
               "pg_stat_activity. If the batch itself writes a key from two Spark partitions (mode='insert'), "
               "write with mode='upsert' (one transaction then writes each key). Raise lock_timeout_ms only if "
               "the holder ends on its own.")
    elif code == "42501":
        what = f"permission denied: {server}"
        fix = f"grant the writer's role INSERT (and UPDATE for upserts) on {table} and on {marker}."
    elif is_retriable(exc):
        what = f"the server or connection failed: {server}"
        fix = "retry the task (its GID is rolled back first if it was left prepared)."

    return PrepareFailed(
        f"Writing {n_rows} rows to {table} (mode={mode}) in prepared transaction {gid!r} on {where} failed: "
        f"{what}. The transaction was rolled back; nothing is prepared. Fix: {fix}",
        retriable=is_retriable(exc),
        sqlstate=exc.pgcode,
    )


def finish_error(exc: psycopg2.Error, action: str, gid: str, where: str) -> PostgresTransactionError:
    server = server_message(exc)
    if exc.pgcode == "0A000":  # prepared transaction belongs to another database
        fix = "connect to the database the transaction was prepared in (pg_prepared_xacts.database)."
    elif exc.pgcode == "42501":
        fix = "connect as the role that prepared it, or as a superuser."
    elif is_retriable(exc):
        fix = "retry; the prepared transaction is still on the server unless the message says otherwise."
    else:
        fix = "see the server's message."
    return PostgresTransactionError(f"{action} {gid!r} on {where} failed: {server}. Fix: {fix}",
                                    retriable=is_retriable(exc), sqlstate=exc.pgcode)
