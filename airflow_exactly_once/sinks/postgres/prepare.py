"""Phase one of the PostgreSQL sink's two-phase commit: one writer's rows made durable but invisible with
``PREPARE TRANSACTION``.

The protocol, per micro-batch: each writer (a Spark partition) calls :func:`prepare_rows`: in ONE
transaction it writes its rows and a marker row (sinks.postgres.markers, keyed by the transaction's
GID, sinks.postgres.gids), then runs ``PREPARE TRANSACTION gid``. The rows are now durable (they
survive a crash of the writer or of the server) but invisible, and the writer returns a small
JSON-able handle. Once every writer has prepared, the coordinator commits the GIDs, and rolls back
those of attempts that lost (phase two, sinks.postgres.commit).

Only psycopg2 is needed. The server must have ``max_prepared_transactions > 0``
(sinks.postgres.server.check_two_phase_supported).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from airflow_exactly_once.sinks.postgres.commit import rollback_prepared, rollback_prepared_if_present
from airflow_exactly_once.sinks.postgres.diagnosis import prepare_failure
from airflow_exactly_once.sinks.postgres.driver import psycopg2, sql
from airflow_exactly_once.sinks.postgres.errors import PostgresTransactionError, PrepareFailed, two_phase_error
from airflow_exactly_once.sinks.postgres.gids import check_gid
from airflow_exactly_once.sinks.postgres.markers import marker_table
from airflow_exactly_once.sinks.postgres.server import close_quietly, connect, describe_dsn, table_identifier


__all__ = [
    "prepare_rows",
]


def _dedupe_by_key(rows: list[Sequence[Any]], key_index: list[int]) -> list[Sequence[Any]]:
    """Keep the last row of each key (in order of the last occurrences): upsert semantics."""
    latest: dict[tuple, Sequence[Any]] = {}
    for row in rows:
        key = tuple(row[i] for i in key_index)
        latest.pop(key, None)
        latest[key] = row
    return list(latest.values())


def _write_sql(table: sql.Identifier, columns: list[str], mode: str, key_columns: list[str]) -> sql.Composed:
    statement = sql.SQL("INSERT INTO {table} ({cols}) VALUES %s").format(
        table=table, cols=sql.SQL(", ").join(map(sql.Identifier, columns)))
    if mode == "upsert":
        others = [c for c in columns if c not in key_columns]
        keys = sql.SQL(", ").join(map(sql.Identifier, key_columns))
        if others:
            updates = sql.SQL(", ").join(
                sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in others)
            statement += sql.SQL(" ON CONFLICT ({keys}) DO UPDATE SET {updates}").format(keys=keys, updates=updates)
        else:
            statement += sql.SQL(" ON CONFLICT ({keys}) DO NOTHING").format(keys=keys)
    return statement


def prepare_rows(
    dsn: str,
    gid: str,
    table: str | Sequence[str],
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    marker: dict[str, Any],
    mode: str = "insert",
    key_columns: Sequence[str] | None = None,
    *,
    marker_schema: str = "public",
    page_size: int = 1000,
    copy_csv: Any = None,
) -> dict[str, Any]:
    """Write ``rows`` and a marker row in one transaction and ``PREPARE TRANSACTION gid``.

    ``table`` is ``"name"``, ``"schema.name"`` or ``("schema", "name")``; ``rows`` are
    sequences in the order of ``columns``. ``mode="insert"`` appends (bulk, with
    ``execute_values``); ``mode="upsert"`` runs ``INSERT ... ON CONFLICT (key_columns)
    DO UPDATE`` (rows sharing a key within the batch: the last one wins). ``marker``
    holds ``pipeline_id``, ``batch_seq``, ``partition_id`` and optionally ``row_count``
    (default: the number of rows given).

    If ``gid`` is already prepared (a retried attempt), it is rolled back first. If its
    marker row is already committed, nothing is written and the handle's ``state`` is
    ``"already-committed"``; otherwise it is ``"prepared"``. The handle is a small
    JSON-able dict (no credentials) to pass to the coordinator.

    ``copy_csv``, for ``mode="insert"`` only: a file-like object of CSV lines in the order
    of ``columns`` (PostgreSQL's CSV: an unquoted empty field is NULL, ``""`` the empty
    string), loaded with ``COPY ... FROM STDIN`` instead of ``rows`` (which must then be
    empty) -- several times faster for large partitions. ``marker["row_count"]`` must
    then say how many lines it holds.

    Raises PrepareFailed (with ``retriable``) and TwoPhaseNotSupported; after an error
    nothing is left prepared (after a lost connection, a best-effort rollback is tried
    and a retry with the same GID rolls back any leftover).
    """
    check_gid(gid)
    if mode not in ("insert", "upsert"):
        raise ValueError(f"mode must be 'insert' or 'upsert', not {mode!r}")
    columns = list(columns)
    if not columns or len(set(columns)) != len(columns):
        raise ValueError(f"columns must be non-empty and distinct, not {columns!r}")
    keys = list(key_columns or [])
    if mode == "upsert":
        missing = [k for k in keys if k not in columns]
        if not keys or missing:
            raise ValueError(f"mode='upsert' needs key_columns, a non-empty subset of columns {columns}; "
                             f"got {key_columns!r}")
    missing_marker = [k for k in ("pipeline_id", "batch_seq", "partition_id") if k not in marker]
    if missing_marker:
        raise ValueError(f"marker lacks {missing_marker}; it needs pipeline_id, batch_seq and partition_id")
    table_id = table_identifier(table)
    table_name = table if isinstance(table, str) else ".".join(table)

    rows = list(rows)
    if copy_csv is not None and (mode != "insert" or rows or "row_count" not in marker):
        raise ValueError("copy_csv needs mode='insert', no rows, and the number of CSV lines in marker['row_count']")
    for i, row in enumerate(rows):
        if len(row) != len(columns):
            raise ValueError(f"row {i} has {len(row)} values but there are {len(columns)} columns {columns}")
    row_count = int(marker.get("row_count", len(rows)))
    if mode == "upsert":
        rows = _dedupe_by_key(rows, [columns.index(k) for k in keys])

    handle: dict[str, Any] = {
        "gid": gid,
        "table": table_name,
        "mode": mode,
        "row_count": row_count,
        "rows_written": row_count if copy_csv is not None else len(rows),
        "marker": {"pipeline_id": str(marker["pipeline_id"]), "batch_seq": int(marker["batch_seq"]),
                   "partition_id": int(marker["partition_id"]), "row_count": row_count},
        "state": "prepared",
    }
    where = describe_dsn(dsn)
    conn = connect(dsn)
    reached_prepare = False
    lock_timeout = None
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('max_prepared_transactions')::int, "
                        "(SELECT database FROM pg_prepared_xacts WHERE gid = %s), current_database(), "
                        "current_setting('lock_timeout')", (gid,))
            max_prepared, leftover_db, this_db, lock_timeout = cur.fetchone()
            if max_prepared <= 0:
                raise two_phase_error(where, max_prepared)
            if leftover_db is not None:
                if leftover_db != this_db:
                    raise PrepareFailed(
                        f"GID {gid!r} is already prepared in database {leftover_db!r}, not {this_db!r} "
                        f"({where}). Fix: use a GID unique to this database, or roll that one back there.")
                rollback_prepared_if_present(cur, gid)  # a retried attempt: discard the old one

            cur.execute("BEGIN")
            cur.execute(sql.SQL("SELECT 1 FROM {t} WHERE gid = %s").format(t=marker_table(marker_schema)), (gid,))
            if cur.fetchone() is not None:
                cur.execute("ROLLBACK")
                handle["state"] = "already-committed"
                return handle
            if copy_csv is not None:
                cur.copy_expert(sql.SQL("COPY {table} ({cols}) FROM STDIN WITH (FORMAT csv)").format(
                    table=table_id, cols=sql.SQL(", ").join(map(sql.Identifier, columns))).as_string(conn),
                    copy_csv)
            elif rows:
                psycopg2.extras.execute_values(
                    cur, _write_sql(table_id, columns, mode, keys).as_string(conn), rows, page_size=page_size)
            cur.execute(
                sql.SQL("INSERT INTO {t} (gid, pipeline_id, batch_seq, partition_id, row_count) "
                        "VALUES (%s, %s, %s, %s, %s)").format(t=marker_table(marker_schema)),
                (gid, handle["marker"]["pipeline_id"], handle["marker"]["batch_seq"],
                 handle["marker"]["partition_id"], row_count),
            )
            reached_prepare = True
            cur.execute("PREPARE TRANSACTION %s", (gid,))
        return handle
    except psycopg2.Error as exc:
        close_quietly(conn)
        if reached_prepare and exc.pgcode is None:
            # The connection broke around PREPARE: it may or may not have happened.
            _best_effort_rollback(dsn, gid)
        raise prepare_failure(exc, gid=gid, table=table_name, mode=mode, key_columns=keys,
                              n_rows=handle["rows_written"], where=where, marker_schema=marker_schema,
                              lock_timeout=lock_timeout) from exc
    finally:
        close_quietly(conn)


def _best_effort_rollback(dsn: str, gid: str) -> None:
    try:
        rollback_prepared(dsn, gid)
    except PostgresTransactionError:
        pass  # the server is unreachable: a retry with this GID, or rollback_prepared_matching, cleans up
