"""PostgreSQL with true two-phase commit: one prepared transaction per Spark partition.

write (preCommit): every Spark partition writes its rows and a marker row in one
transaction and ends it with `PREPARE TRANSACTION <gid>` (durable, invisible); the driver
stores the gids as the batch's handles. notify_complete (commit): `COMMIT PREPARED` for
each gid; a gid that is gone is resolved by its marker row (committed before, or lost).
Prepared transactions of attempts that were fenced, killed or aborted are rolled back
on the next write, commit or abort of the pipeline, so none is left behind.

GIDs are `aeo.<pipeline>.b<batch_seq>.p<partition>.a<epoch>`: the epoch of the write
attempt (the ledger's claim) tells the live attempt from dead ones.

Spec: {"type": "postgres", "conn_id": "<airflow postgres connection>" | "url": "<URL>",
       "table": "[schema.]name", "mode": "insert" | "upsert", "key_columns": [...],
       "order_by": [...], "marker_schema": "public", "writers": n, "lock_timeout_ms": 60000}

Set by the pipeline, not the user, for a dead-letter table (records.bad_records): "transaction_name"
(names its gids and markers instead of the pipeline id, so they never meet the output's) and
"create_columns" (creates the table if it is missing).
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from airflow_exactly_once.core.errors import ConfigurationError, SinkError, TransactionLostError
from airflow_exactly_once.core.lineage_names import DatasetName, postgres_dataset
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import RunWriters, Sink, column_names
from airflow_exactly_once.sinks.postgres import transactions as pgx
from airflow_exactly_once.sinks.postgres.committable import PostgresCommittable
from airflow_exactly_once.sinks.postgres.spec import PostgresSpec
from airflow_exactly_once.sinks.postgres.writer import PostgresPartitionWriter

log = logging.getLogger(__name__)

_GID_TAIL = re.compile(r"^b(\d+)\.p(\d+)\.a(\d+)$")
_URL_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg2", "postgresql+psycopg")


def resolve_dsn(spec: dict[str, Any]) -> str:
    """The server URL of a sink spec: its `url`, or its Airflow `postgres` connection's."""
    if spec.get("url"):
        return str(spec["url"])
    from airflow_exactly_once.connections import postgres_connection_url

    return postgres_connection_url(spec["conn_id"], "the postgres sink", "give the sink a 'url'")


def with_lock_timeout(dsn: str, lock_timeout_ms: int) -> str:
    """The URL with `-c lock_timeout=...` added, so a writer blocked by a lock fails instead of hanging."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    query["options"] = f"{query.get('options', '')} -c lock_timeout={int(lock_timeout_ms)}".strip()
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))  # libpq reads no '+'


def parse_gid(pipeline_id: str, gid: str) -> tuple[int, int, int] | None:
    """(batch_seq, partition, attempt) of one of this pipeline's gids, else None."""
    prefix = pgx.gid_prefix(pipeline_id)
    match = _GID_TAIL.match(gid[len(prefix):]) if gid.startswith(prefix) else None
    return None if match is None else tuple(int(g) for g in match.groups())  # type: ignore[return-value]


class PostgresSink(Sink):
    spec_type = PostgresSpec
    committable_type = PostgresCommittable

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        if bool(spec.get("conn_id")) == bool(spec.get("url")):
            raise ConfigurationError(
                "the postgres sink needs exactly one of 'conn_id' (an Airflow postgres connection, recommended: "
                "the spec is stored in the ledger, a connection keeps the password out of it) or 'url' "
                "('postgresql://user@host:5432/db'), e.g. {'type': 'postgres', 'conn_id': 'postgres_default', "
                "'table': 'public.events'}")
        if spec.get("url") and urlsplit(str(spec["url"])).scheme not in _URL_SCHEMES:
            raise ConfigurationError(f"the postgres sink's url must start with postgresql://, not "
                                     f"{urlsplit(str(spec['url'])).scheme or spec['url']!r}://")
        if not isinstance(spec.get("table"), str) or not spec["table"]:
            raise ConfigurationError("the postgres sink needs a 'table' ('name' or 'schema.name'); create the "
                                     "table first: its types and keys are yours to choose")
        self.table: str = spec["table"]
        self.mode: str = spec.get("mode", "insert")
        self.key_columns = column_names(spec.get("key_columns"), "the postgres sink's key_columns")
        self.order_by = column_names(spec.get("order_by"), "the postgres sink's order_by")
        self.marker_schema: str = spec.get("marker_schema", "public")
        self.writers: int | None = int(spec["writers"]) if spec.get("writers") else None
        self.lock_timeout_ms = int(spec.get("lock_timeout_ms", 60_000))
        self.page_size = int(spec.get("page_size", 1000))
        self.transaction_name: str | None = spec.get("transaction_name")
        self.create_columns: dict[str, str] = dict(spec.get("create_columns") or {})
        self._dsn: str | None = None

    @property
    def dsn(self) -> str:
        if self._dsn is None:
            self._dsn = resolve_dsn(self.spec)
        return self._dsn

    def lineage_dataset(self) -> DatasetName:
        return postgres_dataset(self.dsn, self.table)

    # -- plan ----------------------------------------------------------------------

    def check(self, pipeline_id: str) -> None:
        """Two-phase commit enabled, the table there, an upsert key unique; marker table created."""
        try:
            pgx.check_two_phase_supported(self.dsn)
            self._create_table_if_missing()
            self._table_columns()
            self._upsert_key()
            pgx.ensure_marker_table(self.dsn, self.marker_schema)
        except pgx.TwoPhaseNotSupported as exc:
            raise ConfigurationError(str(exc)) from exc
        except pgx.PostgresTransactionError as exc:
            raise SinkError(f"postgres sink check failed: {exc}", retriable=exc.retriable) from exc

    # -- write ---------------------------------------------------------------------

    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> PostgresCommittable:
        """Prepare one transaction per non-empty Spark partition; roll them all back on failure."""
        epoch = batch.epoch  # the write attempt: its gids carry it
        try:
            self._rollback_dead_attempts(batch, keep_epoch=epoch)
            pgx.ensure_marker_table(self.dsn, self.marker_schema)
            self._create_table_if_missing()
            columns = self._writable_columns(list(frame.columns))
            keys = self._upsert_key()
            slots = self._free_slots()
        except pgx.PostgresTransactionError as exc:
            raise SinkError(f"postgres sink: {exc}", retriable=exc.retriable) from exc
        if self.mode == "upsert":
            # Rows of one key must meet in one transaction: across two prepared transactions the
            # second would wait for the first's row lock until commit, which never comes.
            frame = frame.repartition(self.writers, *keys) if self.writers else frame.repartition(*keys)
        elif self.writers:
            frame = frame.repartition(self.writers)
        frame = frame.coalesce(slots)  # never more transactions than free prepared slots (keys stay together)
        if self.order_by:
            frame = frame.sortWithinPartitions(*self.order_by)  # upsert: the last row of a key wins
        writer = PostgresPartitionWriter(
            dsn=with_lock_timeout(self.dsn, self.lock_timeout_ms), pipeline_id=self._owner(batch),
            batch_seq=batch.seq, attempt=epoch, table=self.table, columns=tuple(columns), mode=self.mode,
            key_columns=keys, marker_schema=self.marker_schema, page_size=self.page_size)
        try:
            parts = run_writers(frame, writer)  # columns: frame.columns, in order
        except Exception:
            self._rollback_attempt(batch, epoch)
            raise
        return PostgresCommittable.of(self.table, self.mode, epoch, parts)

    # -- notify_complete / abort ---------------------------------------------------

    def verify_staged(self, batch: Batch, committable: PostgresCommittable) -> None:
        try:
            self._prepared_gids(batch, list(committable.gids))
        except pgx.PostgresTransactionError as exc:
            raise SinkError(f"postgres sink check of batch {batch.seq}: {exc}", retriable=exc.retriable) from exc

    def commit(self, batch: Batch, committable: PostgresCommittable) -> str:
        """COMMIT PREPARED every gid; all-or-nothing when one is found lost before any commit."""
        gids = list(committable.gids)
        try:
            prepared = self._prepared_gids(batch, gids)
            outcomes = [pgx.commit_prepared(self.dsn, g, marker_schema=self.marker_schema)
                        for g in gids if g in prepared]
            orphans = self._rollback_dead_attempts(batch, keep=gids)
        except TransactionLostError as exc:  # found lost, or rolled back between our look and our commit
            self._prepared_gids(batch, gids)  # one committed already: "half committed", never replayed as lost
            raise exc.restated(str(exc), batch=batch.seq) from exc
        except pgx.PostgresTransactionError as exc:
            raise SinkError(f"postgres sink commit of batch {batch.seq}: {exc}", retriable=exc.retriable) from exc
        now = outcomes.count("committed")
        return (f"committed {len(gids)} prepared transaction(s) into {self.table} ({now} now, {len(gids) - now} "
                f"already){f'; rolled back {len(orphans)} orphan(s)' if orphans else ''}")

    def abort(self, batch: Batch, committable: PostgresCommittable | None) -> str:
        """Roll back `committable` (a fenced attempt's), or every attempt of the batch when None."""
        try:
            if committable is not None:
                results = [pgx.rollback_prepared(self.dsn, g, marker_schema=self.marker_schema)
                           for g in committable.gids]
                return f"rolled back {results.count('rolled-back')} prepared transaction(s) of this attempt"
            orphans = self._rollback_dead_attempts(batch, keep=())
        except pgx.PostgresTransactionError as exc:
            raise SinkError(f"postgres sink abort of batch {batch.seq}: {exc}", retriable=exc.retriable) from exc
        return f"rolled back {len(orphans)} prepared transaction(s) of batch {batch.seq}"

    # -- helpers -------------------------------------------------------------------

    def _owner(self, batch: Batch) -> str:
        """The name in this sink's gids and marker rows: the pipeline's, or the dead-letter table's."""
        return self.transaction_name or batch.pipeline_id

    def _prepared_gids(self, batch: Batch, gids: list[str]) -> set[str]:
        """Which of `gids` are still prepared; raises when one is neither prepared nor committed."""
        owner = self._owner(batch)
        prepared = set(pgx.list_prepared(self.dsn, pgx.gid_prefix(owner, batch.seq)))
        committed = {m["gid"] for m in pgx.list_markers(self.dsn, owner, batch.seq, marker_schema=self.marker_schema)}
        lost = [g for g in gids if g not in prepared and g not in committed]
        if lost:
            self._on_lost(batch, gids, lost, committed)
        return prepared

    def _create_table_if_missing(self) -> None:
        """A dead-letter table is the pipeline's to create; an output table never is."""
        if self.create_columns:
            pgx.create_table_if_missing(self.dsn, self.table, self.create_columns)

    def _on_lost(self, batch: Batch, gids: list[str], lost: list[str], committed: set[str]) -> None:
        done = [g for g in gids if g in committed]
        if done:
            raise SinkError(
                f"batch {batch.seq} is half committed: {len(done)} of its prepared transactions were committed "
                f"but {lost} are gone without a marker row (rolled back outside this pipeline, e.g. by an "
                f"operator). Its rows in {self.table} are incomplete and cannot be completed; repair the table "
                "by hand (rows of the lost partitions are missing) before resuming the pipeline.")
        self._rollback_dead_attempts(batch, keep=())
        raise TransactionLostError(
            f"prepared transaction(s) {lost} of batch {batch.seq} are gone and were never committed (rolled back "
            f"by an operator or lost with the server's data); nothing of the batch was committed",
            sink=self.type_name, batch=batch.seq, lost=lost, reason="rolled back: neither prepared nor committed")

    def _rollback_dead_attempts(self, batch: Batch, keep=(), keep_epoch: int | None = None) -> list[str]:
        """Roll back this pipeline's prepared gids that can no longer be committed.

        Dead are: gids of this batch not in `keep` and not of the live attempt `keep_epoch`, and,
        in range_mode "continuation", gids of older batches (by the time a batch is written or
        committed, every older batch is COMMITTED or ABORTED: the plan step commits PREPARED
        batches first). Batches of other data intervals ("interval") may be PREPARED at the same
        time, so there only this batch's are touched; an older batch's are rolled back by its
        own commit or abort. Gids of newer batches are never touched.
        """
        older_are_done = self.pipeline is None or self.pipeline.range_mode == "continuation"

        def dead(gid: str) -> bool:
            parsed = parse_gid(self._owner(batch), gid)
            if parsed is None:
                return False
            seq, _, epoch = parsed
            return (older_are_done and seq < batch.seq) or (seq == batch.seq and gid not in keep
                                                             and epoch != keep_epoch)

        rolled_back = pgx.rollback_prepared_matching(self.dsn, pgx.gid_prefix(self._owner(batch)), dead)
        if rolled_back:
            log.info("rolled back %d prepared transaction(s) of dead attempts: %s", len(rolled_back), rolled_back)
        return rolled_back

    def _rollback_attempt(self, batch: Batch, epoch: int) -> None:
        """After a failed write, what this attempt's partitions prepared before the failure."""
        def of_this_attempt(gid: str) -> bool:
            parsed = parse_gid(self._owner(batch), gid)
            return parsed is not None and parsed[2] == epoch

        try:
            pgx.rollback_prepared_matching(self.dsn, pgx.gid_prefix(self._owner(batch), batch.seq), of_this_attempt)
        except pgx.PostgresTransactionError as exc:
            log.warning("could not roll back this attempt's prepared transactions (%s); the next write, commit "
                        "or abort of the pipeline does", exc)

    def _query(self, statement: str, params: tuple = ()) -> list[tuple]:
        return pgx.query(self.dsn, statement, params)

    def _table_columns(self) -> list[str]:
        rows = self._query(
            "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 "
            "AND NOT a.attisdropped ORDER BY a.attnum", (self._regclass(),))
        if not rows:
            exists = self._query("SELECT to_regclass(%s) IS NOT NULL", (self._regclass(),))[0][0]
            if not exists:
                raise ConfigurationError(
                    f"table {self.table} does not exist in {pgx.describe_dsn(self.dsn)}; create it first (the sink "
                    "never creates tables: their column types and keys are yours to choose), or correct 'table'")
        return [r[0] for r in rows]

    def _regclass(self) -> str:
        """The table name as to_regclass reads it: each part quoted, so case is kept."""
        return ".".join('"' + part.replace('"', '""') + '"' for part in self.table.split(".", 1))

    def _writable_columns(self, columns: list[str]) -> list[str]:
        existing = self._table_columns()
        missing = [c for c in columns if c not in existing]
        if missing:
            folded = {c.lower(): c for c in existing}
            hints = [f"{c!r} -> {folded[c.lower()]!r}" for c in missing if c.lower() in folded]
            raise SinkError(
                f"the transform's output has column(s) {missing} that table {self.table} lacks (its columns: "
                f"{existing}). Fix: rename them in the transform (names are case-sensitive"
                f"{'; ' + ', '.join(hints) if hints else ''}), drop them, or add them to the table.")
        return columns

    def _upsert_key(self) -> tuple[str, ...]:
        if self.mode != "upsert":
            return ()
        unique = self._query(
            "SELECT array_agg(a.attname ORDER BY a.attname) FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL "
            "GROUP BY i.indexrelid, i.indisprimary ORDER BY i.indisprimary DESC", (self._regclass(),))
        keys = [tuple(r[0]) for r in unique]
        if not self.key_columns:
            if not keys:
                raise ConfigurationError(f"mode 'upsert' needs a primary key or unique index on {self.table}, or "
                                         "key_columns naming the columns of one")
            return keys[0]
        if tuple(sorted(self.key_columns)) not in keys:
            raise ConfigurationError(
                f"key_columns {list(self.key_columns)} are not the columns of a unique index of {self.table} "
                f"(unique keys: {[list(k) for k in keys] or 'none'}). Fix: CREATE UNIQUE INDEX ON {self.table} "
                f"({', '.join(self.key_columns)}), or name the columns of an existing one")
        return self.key_columns

    def _free_slots(self) -> int:
        limit, used = self._query("SELECT current_setting('max_prepared_transactions')::int, "
                                  "(SELECT count(*) FROM pg_prepared_xacts)")[0]
        if limit <= 0:
            raise ConfigurationError(str(pgx.two_phase_error(pgx.describe_dsn(self.dsn), limit)))
        if limit - used < 1:
            raise SinkError(f"all {limit} prepared-transaction slots of {pgx.describe_dsn(self.dsn)} are in use; "
                            "commit or roll back the ones left behind (SELECT * FROM pg_prepared_xacts) or raise "
                            "max_prepared_transactions", retriable=True)
        return limit - used
