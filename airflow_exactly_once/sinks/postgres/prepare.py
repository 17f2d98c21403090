"""PostgreSQL two-phase commit primitives for exactly-once micro-batch sinks.

The protocol, per micro-batch:

1. Each writer (a Spark partition) calls :func:`prepare_rows`: in ONE transaction it
   writes its rows and a marker row (``airflow_exactly_once_markers``, keyed by the
   transaction's GID), then runs ``PREPARE TRANSACTION gid``. The rows are now durable
   (they survive a crash of the writer or of the server) but invisible, and the writer
   returns a small JSON-able handle.
2. Once every writer has prepared, the coordinator calls :func:`commit_prepared` for
   each handle's GID, from any process. Committing is idempotent: a GID that is gone
   but whose marker row exists was committed before (``"already-committed"``); a GID
   that is gone without a marker was rolled back, and the core's ``TransactionLostError`` says so.
3. GIDs of attempts that lost (failed or speculative tasks) are removed with
   :func:`rollback_prepared_matching`.

Only psycopg2 is needed. The server must have ``max_prepared_transactions > 0``
(:func:`check_two_phase_supported`). A prepared transaction holds its row locks until
it is committed or rolled back, and counts against ``max_prepared_transactions``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from airflow_exactly_once.core.errors import MissingExtraError, SinkError, TransactionLostError

try:
    import psycopg2
    import psycopg2.errors
    import psycopg2.extensions
    import psycopg2.extras
    from psycopg2 import sql
except ModuleNotFoundError as exc:
    if exc.name != "psycopg2":
        raise
    raise MissingExtraError("the PostgreSQL sink", "postgres", exc.name) from exc

__all__ = [
    "MARKER_TABLE",
    "PostgresTransactionError",
    "TwoPhaseNotSupported",
    "PrepareFailed",
    "make_gid",
    "gid_prefix",
    "check_two_phase_supported",
    "ensure_marker_table",
    "create_table_if_missing",
    "prepare_rows",
    "commit_prepared",
    "rollback_prepared",
    "list_prepared",
    "rollback_prepared_matching",
    "query",
    "connect",
    "describe_dsn",
    "two_phase_error",
    "list_markers",
]

MARKER_TABLE = "airflow_exactly_once_markers"
GID_NAMESPACE = "aeo"
MAX_GID_BYTES = 199  # PostgreSQL's limit is GIDSIZE (200) including the terminating NUL.
_SAFE = re.compile(r"[A-Za-z0-9_-]+")
_UNSAFE_CHAR = re.compile(r"[^A-Za-z0-9_-]")

# SQLSTATE classes after which trying again can succeed.
_RETRIABLE_CLASSES = ("08", "40", "53", "57", "58")
_RETRIABLE_STATES = {"55006", "55P03", "42710"}  # object in use, lock not available, GID in use
_NOT_RETRIABLE_STATES = {"53200"}  # max_prepared_transactions reached: needs an operator


class PostgresTransactionError(SinkError):
    """A two-phase commit step failed; a SinkError, so ``retriable`` tells whether trying again can help."""

    def __init__(self, message: str, *, retriable: bool = False, sqlstate: str | None = None) -> None:
        super().__init__(message, retriable=retriable)
        self.sqlstate = sqlstate


class TwoPhaseNotSupported(PostgresTransactionError):
    """The server has ``max_prepared_transactions = 0``."""


class PrepareFailed(PostgresTransactionError):
    """Writing or preparing a partition's rows failed; nothing was left prepared."""


# -- GIDs ----------------------------------------------------------------------------


def _pipeline_slug(pipeline_id: str) -> str:
    """``pipeline_id`` as GID-safe text, one-to-one (up to a 48-bit hash).

    Ids of letters, digits, ``_`` and ``-`` (up to 64 characters) are used as they are.
    Others are cleaned and get ``~`` plus a hash of the original: ``~`` never occurs in
    a clean id, so a cleaned id cannot collide with a clean one.
    """
    if not isinstance(pipeline_id, str) or not pipeline_id:
        raise ValueError(f"pipeline_id must be a non-empty string, not {pipeline_id!r}")
    if _SAFE.fullmatch(pipeline_id) and len(pipeline_id) <= 64:
        return pipeline_id
    digest = hashlib.sha256(pipeline_id.encode()).hexdigest()[:12]
    return f"{_UNSAFE_CHAR.sub('_', pipeline_id)[:48]}~{digest}"


def _non_negative(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, not {value!r}")
    return value


def gid_prefix(pipeline_id: str, batch_seq: int | None = None) -> str:
    """The prefix shared by all GIDs of a pipeline (or of one of its batches).

    It ends with ``.``, so the prefix of batch 1 does not match batch 10, nor pipeline
    ``a`` pipeline ``ab``.
    """
    prefix = f"{GID_NAMESPACE}.{_pipeline_slug(pipeline_id)}."
    if batch_seq is not None:
        prefix += f"b{_non_negative('batch_seq', batch_seq)}."
    return prefix


def make_gid(pipeline_id: str, batch_seq: int, partition_id: int, attempt: int) -> str:
    """The GID of one writer attempt: ``aeo.<pipeline>.b<batch>.p<partition>.a<attempt>``.

    Only ``[A-Za-z0-9_.~-]``, at most 199 bytes (PostgreSQL allows 199).
    """
    gid = (f"{gid_prefix(pipeline_id, batch_seq)}p{_non_negative('partition_id', partition_id)}"
           f".a{_non_negative('attempt', attempt)}")
    _check_gid(gid)
    return gid


def _check_gid(gid: str) -> None:
    if not isinstance(gid, str) or not gid:
        raise ValueError(f"gid must be a non-empty string, not {gid!r}")
    if len(gid.encode()) > MAX_GID_BYTES:
        raise ValueError(f"gid is {len(gid.encode())} bytes; PostgreSQL allows at most {MAX_GID_BYTES}: {gid!r}")


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


def is_retriable(exc: psycopg2.Error) -> bool:
    code = exc.pgcode
    if code is None:  # no server reply: the connection failed
        return isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError))
    if code in _NOT_RETRIABLE_STATES:
        return False
    return code in _RETRIABLE_STATES or code[:2] in _RETRIABLE_CLASSES


def server_message(exc: psycopg2.Error) -> str:
    text = (exc.pgerror or str(exc)).strip()
    return re.sub(r"\s+", " ", text)


def _close_quietly(conn: psycopg2.extensions.connection) -> None:
    try:
        if not conn.closed and conn.info.transaction_status != psycopg2.extensions.TRANSACTION_STATUS_IDLE:
            conn.cursor().execute("ROLLBACK")
    except psycopg2.Error:
        pass
    try:
        conn.close()
    except psycopg2.Error:
        pass


# -- server checks and the marker table ----------------------------------------------


def _with_cursor(conn_or_dsn, fn):
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


def two_phase_error(where: str, setting: int | str = 0) -> TwoPhaseNotSupported:
    return TwoPhaseNotSupported(
        f"PostgreSQL at {where} has max_prepared_transactions = {setting}, so PREPARE TRANSACTION "
        "(two-phase commit) is disabled and exactly-once writes are impossible. Fix: set "
        "max_prepared_transactions in postgresql.conf (or ALTER SYSTEM SET max_prepared_transactions = 64) "
        "to at least the number of partitions written at once, plus headroom, and restart the server "
        "(a reload is not enough).",
        retriable=False,
    )


def check_two_phase_supported(conn_or_dsn) -> int:
    """Return the server's ``max_prepared_transactions``; raise TwoPhaseNotSupported if it is 0.

    ``conn_or_dsn`` is a psycopg2 connection or a DSN / URL string.
    """
    def show(cur) -> tuple[int, str]:
        cur.execute("SELECT current_setting('max_prepared_transactions')::int, "
                    "coalesce(host(inet_server_addr()), 'local socket') || ':' || current_setting('port')")
        return cur.fetchone()

    value, where = _with_cursor(conn_or_dsn, show)
    if value <= 0:
        raise two_phase_error(where if not isinstance(conn_or_dsn, str) else describe_dsn(conn_or_dsn), value)
    return value


def _marker_table(schema: str) -> sql.Composable:
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
                    (_marker_table(schema).as_string(cur), sql.Identifier(schema, f"{MARKER_TABLE}_batch_idx")
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
        ).format(table=_marker_table(schema)))
        cur.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {index} ON {table} (pipeline_id, batch_seq)").format(
            index=sql.Identifier(f"{MARKER_TABLE}_batch_idx"), table=_marker_table(schema)))

    _create_if_missing(conn_or_dsn, create)


def create_table_if_missing(dsn: str, table: str, column_types: dict[str, str]) -> None:
    """CREATE TABLE IF NOT EXISTS ``table`` with ``column_types`` ({name: SQL type}), committed."""
    columns = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind))
                                 for name, kind in column_types.items())

    def create(cur) -> None:
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (_table_identifier(table).as_string(cur),))
        if cur.fetchone()[0]:
            return
        cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(_table_identifier(table), columns))
        cur.connection.commit()

    try:
        _create_if_missing(dsn, create)
    except psycopg2.Error as exc:
        raise PostgresTransactionError(f"creating {table} on {describe_dsn(dsn)}: {server_message(exc)}",
                                       retriable=is_retriable(exc)) from exc


def _create_if_missing(conn_or_dsn, create: Callable[[Any], None]) -> None:
    for attempt in range(3):
        try:
            _with_cursor(conn_or_dsn, create)
            return
        except psycopg2.errors.UniqueViolation:
            # Two sessions ran CREATE ... IF NOT EXISTS at once; the other one won.
            if not isinstance(conn_or_dsn, str):
                conn_or_dsn.rollback()
            if attempt == 2:
                raise


def list_markers(dsn: str, pipeline_id: str, batch_seq: int | None = None,
                 *, marker_schema: str = "public") -> list[dict[str, Any]]:
    """Committed marker rows of a pipeline (or one batch), ordered by batch and partition."""
    query = sql.SQL("SELECT gid, pipeline_id, batch_seq, partition_id, row_count, created_at FROM {t} "
                    "WHERE pipeline_id = %s").format(t=_marker_table(marker_schema))
    params: list[Any] = [pipeline_id]
    if batch_seq is not None:
        query += sql.SQL(" AND batch_seq = %s")
        params.append(batch_seq)
    query += sql.SQL(" ORDER BY batch_seq, partition_id, gid")

    def fetch(cur):
        cur.execute(query, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    return _with_cursor(dsn, fetch)


# -- prepare -------------------------------------------------------------------------


def _table_identifier(table: str | Sequence[str]) -> sql.Identifier:
    if isinstance(table, str):
        parts = table.split(".", 1)
    else:
        parts = list(table)
    if not 1 <= len(parts) <= 2 or not all(isinstance(p, str) and p for p in parts):
        raise ValueError(f"table must be 'name', 'schema.name' or ('schema', 'name'), not {table!r}")
    return sql.Identifier(*parts)


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


def _prepare_failure(exc: psycopg2.Error, *, gid: str, table: str, mode: str, key_columns: list[str],
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
    _check_gid(gid)
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
    table_id = _table_identifier(table)
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
                _rollback_prepared_if_present(cur, gid)  # a retried attempt: discard the old one

            cur.execute("BEGIN")
            cur.execute(sql.SQL("SELECT 1 FROM {t} WHERE gid = %s").format(t=_marker_table(marker_schema)), (gid,))
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
                        "VALUES (%s, %s, %s, %s, %s)").format(t=_marker_table(marker_schema)),
                (gid, handle["marker"]["pipeline_id"], handle["marker"]["batch_seq"],
                 handle["marker"]["partition_id"], row_count),
            )
            reached_prepare = True
            cur.execute("PREPARE TRANSACTION %s", (gid,))
        return handle
    except psycopg2.Error as exc:
        _close_quietly(conn)
        if reached_prepare and exc.pgcode is None:
            # The connection broke around PREPARE: it may or may not have happened.
            _best_effort_rollback(dsn, gid)
        raise _prepare_failure(exc, gid=gid, table=table_name, mode=mode, key_columns=keys,
                               n_rows=handle["rows_written"], where=where, marker_schema=marker_schema,
                               lock_timeout=lock_timeout) from exc
    finally:
        _close_quietly(conn)


def _best_effort_rollback(dsn: str, gid: str) -> None:
    try:
        rollback_prepared(dsn, gid)
    except PostgresTransactionError:
        pass  # the server is unreachable: a retry with this GID, or rollback_prepared_matching, cleans up


def _rollback_prepared_if_present(cur, gid: str) -> bool:
    try:
        cur.execute("ROLLBACK PREPARED %s", (gid,))
        return True
    except psycopg2.errors.UndefinedObject:
        return False  # gone meanwhile (committed or rolled back by someone else)


# -- commit, rollback, cleanup -------------------------------------------------------


def _marker_exists(cur, gid: str, marker_schema: str) -> bool:
    cur.execute(sql.SQL("SELECT 1 FROM {t} WHERE gid = %s").format(t=_marker_table(marker_schema)), (gid,))
    return cur.fetchone() is not None


def _finish_error(exc: psycopg2.Error, action: str, gid: str, where: str) -> PostgresTransactionError:
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


def commit_prepared(dsn: str, gid: str, *, marker_schema: str = "public") -> str:
    """``COMMIT PREPARED gid``, idempotently.

    Returns ``"committed"`` if this call committed it, ``"already-committed"`` if the GID
    is gone and its marker row exists. Raises TransactionLostError (not retriable) if the GID
    is gone without a marker, PostgresTransactionError (``retriable=True`` for connection
    failures) otherwise.
    """
    _check_gid(gid)
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
                if _marker_exists(cur, gid, marker_schema):
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
        raise _finish_error(exc, "COMMIT PREPARED", gid, where) from exc
    finally:
        _close_quietly(conn)


def rollback_prepared(dsn: str, gid: str, *, marker_schema: str = "public") -> str:
    """``ROLLBACK PREPARED gid``, idempotently.

    Returns ``"rolled-back"``, ``"absent"`` (nothing prepared under that GID), or
    ``"already-committed"`` (nothing prepared, but the GID's marker row is committed:
    too late to roll back).
    """
    _check_gid(gid)
    where = describe_dsn(dsn)
    conn = connect(dsn)
    try:
        with conn.cursor() as cur:
            if _rollback_prepared_if_present(cur, gid):
                return "rolled-back"
            try:
                return "already-committed" if _marker_exists(cur, gid, marker_schema) else "absent"
            except psycopg2.errors.UndefinedTable:
                return "absent"
    except psycopg2.Error as exc:
        raise _finish_error(exc, "ROLLBACK PREPARED", gid, where) from exc
    finally:
        _close_quietly(conn)


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
        return _with_cursor(dsn, fetch)
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
                if dead(gid) and _rollback_prepared_if_present(cur, gid):
                    rolled_back.append(gid)
    except psycopg2.Error as exc:
        raise PostgresTransactionError(
            f"Rolling back prepared transactions {prefix!r}* on {where} failed after {len(rolled_back)} of them: "
            f"{server_message(exc)}", retriable=is_retriable(exc)) from exc
    finally:
        _close_quietly(conn)
    return rolled_back


def query(dsn: str, statement: str, params: tuple = ()) -> list[tuple]:
    """One statement in its own connection; its rows. Errors say which server and whether a retry can help."""
    def run(cur) -> list[tuple]:
        cur.execute(statement, params)
        return cur.fetchall() if cur.description else []

    try:
        return _with_cursor(dsn, run)
    except psycopg2.Error as exc:
        raise PostgresTransactionError(f"{describe_dsn(dsn)}: {server_message(exc)}",
                                       retriable=is_retriable(exc)) from exc
