"""The marker table, ``airflow_exactly_once_markers``: one row per committed GID, the proof that it was committed.

Each writer inserts its marker row in the same prepared transaction as its rows (sinks.postgres.prepare),
so the marker is committed exactly when the rows are. Once a GID is gone from ``pg_prepared_xacts``, its
marker row tells a commit that happened (``"already-committed"``) from a rollback (rows lost): that is
what makes committing idempotent (sinks.postgres.commit).
"""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.sinks.postgres.driver import sql
from airflow_exactly_once.sinks.postgres.server import create_if_missing, with_cursor


__all__ = [
    "MARKER_TABLE",
    "ensure_marker_table",
    "list_markers",
]

MARKER_TABLE = "airflow_exactly_once_markers"


def marker_table(schema: str) -> sql.Composable:
    return sql.Identifier(schema, MARKER_TABLE)


def ensure_marker_table(conn_or_dsn, schema: str = "public") -> None:
    """Create ``<schema>.airflow_exactly_once_markers`` if it does not exist.

    Call once (from the driver) before writers run: creating it inside the writers'
    transactions would serialise them on the catalog. With a connection whose
    transaction was idle, the DDL is committed.
    """
    def create(cur) -> None:
        # Look first: CREATE INDEX IF NOT EXISTS locks the table before it finds the index, and
        # would wait forever for prepared transactions holding marker rows (another batch's).
        cur.execute("SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL",
                    (marker_table(schema).as_string(cur), sql.Identifier(schema, f"{MARKER_TABLE}_batch_idx")
                     .as_string(cur)))
        if cur.fetchone()[0]:
            return
        cur.execute(sql.SQL(
            "CREATE TABLE IF NOT EXISTS {table} ("
            " gid text PRIMARY KEY,"
            " pipeline_id text NOT NULL,"
            " batch_seq bigint NOT NULL,"
            " partition_id int NOT NULL,"
            " row_count bigint NOT NULL,"
            " created_at timestamptz NOT NULL DEFAULT now())"
        ).format(table=marker_table(schema)))
        cur.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {index} ON {table} (pipeline_id, batch_seq)").format(
            index=sql.Identifier(f"{MARKER_TABLE}_batch_idx"), table=marker_table(schema)))

    create_if_missing(conn_or_dsn, create)


def marker_exists(cur, gid: str, marker_schema: str) -> bool:
    cur.execute(sql.SQL("SELECT 1 FROM {t} WHERE gid = %s").format(t=marker_table(marker_schema)), (gid,))
    return cur.fetchone() is not None


def list_markers(dsn: str, pipeline_id: str, batch_seq: int | None = None,
                 *, marker_schema: str = "public") -> list[dict[str, Any]]:
    """Committed marker rows of a pipeline (or one batch), ordered by batch and partition."""
    query = sql.SQL("SELECT gid, pipeline_id, batch_seq, partition_id, row_count, created_at FROM {t} "
                    "WHERE pipeline_id = %s").format(t=marker_table(marker_schema))
    params: list[Any] = [pipeline_id]
    if batch_seq is not None:
        query += sql.SQL(" AND batch_seq = %s")
        params.append(batch_seq)
    query += sql.SQL(" ORDER BY batch_seq, partition_id, gid")

    def fetch(cur):
        cur.execute(query, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    return with_cursor(dsn, fetch)
