"""Phase two of the PostgreSQL sink's two-phase commit: ``COMMIT PREPARED`` or ``ROLLBACK PREPARED`` of the
GIDs phase one (sinks.postgres.prepare) left, from any process, and the cleanup of the GIDs no one will commit.

Once every writer has prepared, the coordinator calls :func:`commit_prepared` for each handle's GID.
Committing is idempotent: a GID that is gone but whose marker row exists was committed before
(``"already-committed"``); a GID that is gone without a marker was rolled back, and the core's
``TransactionLostError`` says so. GIDs of attempts that lost (failed or speculative tasks) are found in
``pg_prepared_xacts`` by their prefix and removed with :func:`rollback_prepared_matching`. A prepared
transaction holds its row locks until it is committed or rolled back, and counts against
``max_prepared_transactions``.
"""

from __future__ import annotations

from collections.abc import Callable

from airflow_exactly_once.core.errors import TransactionLostError
from airflow_exactly_once.sinks.postgres.diagnosis import finish_error
from airflow_exactly_once.sinks.postgres.driver import psycopg2
from airflow_exactly_once.sinks.postgres.errors import PostgresTransactionError, is_retriable, server_message
from airflow_exactly_once.sinks.postgres.gids import check_gid
from airflow_exactly_once.sinks.postgres.markers import MARKER_TABLE, marker_exists
from airflow_exactly_once.sinks.postgres.server import close_quietly, connect, describe_dsn, with_cursor


__all__ = [
    "commit_prepared",
    "rollback_prepared",
    "list_prepared",
    "rollback_prepared_matching",
]


def rollback_prepared_if_present(cur, gid: str) -> bool:
    try:
        cur.execute("ROLLBACK PREPARED %s", (gid,))
        return True
    except psycopg2.errors.UndefinedObject:
        return False  # gone meanwhile (committed or rolled back by someone else)


def commit_prepared(dsn: str, gid: str, *, marker_schema: str = "public") -> str:
    """``COMMIT PREPARED gid``, idempotently.

    Returns ``"committed"`` if this call committed it, ``"already-committed"`` if the GID
    is gone and its marker row exists. Raises TransactionLostError (not retriable) if the GID
    is gone without a marker, PostgresTransactionError (``retriable=True`` for connection
    failures) otherwise.
    """
    check_gid(gid)
    where = describe_dsn(dsn)
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            try:
                cur.execute("COMMIT PREPARED %s", (gid,))
                return "committed"
            except psycopg2.errors.UndefinedObject:
                pass
            try:
                if marker_exists(cur, gid, marker_schema):
                    return "already-committed"
            except psycopg2.errors.UndefinedTable:
                pass
            raise TransactionLostError(
                f"Prepared transaction {gid!r} on {where} is gone and no marker row for it exists in "
                f"{marker_schema}.{MARKER_TABLE}: it was rolled back (by rollback_prepared, "
                f"an operator, or never prepared), so its rows are not in the table. Fix: re-run the batch "
                f"from its source offsets; committing cannot succeed.",
                sink="postgres", lost=[gid], reason="rolled back: neither prepared nor marked committed",
                retriable=False,
            )
    except psycopg2.Error as exc:
        raise finish_error(exc, "COMMIT PREPARED", gid, where) from exc
    finally:
        close_quietly(conn)


def rollback_prepared(dsn: str, gid: str, *, marker_schema: str = "public") -> str:
    """``ROLLBACK PREPARED gid``, idempotently.

    Returns ``"rolled-back"``, ``"absent"`` (nothing prepared under that GID), or
    ``"already-committed"`` (nothing prepared, but the GID's marker row is committed:
    too late to roll back).
    """
    check_gid(gid)
    where = describe_dsn(dsn)
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            if rollback_prepared_if_present(cur, gid):
                return "rolled-back"
            try:
                return "already-committed" if marker_exists(cur, gid, marker_schema) else "absent"
            except psycopg2.errors.UndefinedTable:
                return "absent"
    except psycopg2.Error as exc:
        raise finish_error(exc, "ROLLBACK PREPARED", gid, where) from exc
    finally:
        close_quietly(conn)


def list_prepared(dsn: str, prefix: str = "", *, all_databases: bool = False) -> list[str]:
    """GIDs in ``pg_prepared_xacts`` starting with ``prefix`` (literally; ``_`` and ``%`` are
    not wildcards), oldest first; only those of the DSN's database unless ``all_databases``."""
    def fetch(cur) -> list[str]:
        cur.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE left(gid, length(%s)) = %s "
            "AND (%s OR database = current_database()) ORDER BY prepared, gid",
            (prefix, prefix, all_databases),
        )
        return [row[0] for row in cur.fetchall()]

    try:
        return with_cursor(dsn, fetch)
    except psycopg2.Error as exc:
        raise PostgresTransactionError(f"Listing prepared transactions on {describe_dsn(dsn)} failed: "
                                       f"{server_message(exc)}", retriable=is_retriable(exc)) from exc


def rollback_prepared_matching(dsn: str, prefix: str, dead: Callable[[str], bool]) -> list[str]:
    """Roll back every prepared GID of this database that starts with ``prefix`` and that ``dead(gid)`` accepts.

    Returns the GIDs rolled back. ``prefix`` must be non-empty (use :func:`gid_prefix`), so
    other applications' prepared transactions are never touched.
    """
    if not prefix:
        raise ValueError("rollback_prepared_matching needs a non-empty prefix, e.g. gid_prefix(pipeline_id)")
    where = describe_dsn(dsn)
    rolled_back = []
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT gid FROM pg_prepared_xacts WHERE left(gid, length(%s)) = %s "
                        "AND database = current_database() ORDER BY prepared, gid", (prefix, prefix))
            for (gid,) in cur.fetchall():
                if dead(gid) and rollback_prepared_if_present(cur, gid):
                    rolled_back.append(gid)
    except psycopg2.Error as exc:
        raise PostgresTransactionError(
            f"Rolling back prepared transactions {prefix!r}* on {where} failed after {len(rolled_back)} of them: "
            f"{server_message(exc)}", retriable=is_retriable(exc)) from exc
    finally:
        close_quietly(conn)
    return rolled_back
