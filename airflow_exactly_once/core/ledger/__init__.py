"""The offset ledger: the only source of truth for what has been committed.

Plain SQLAlchemy Core, so the same code runs on the embedded SQLite file and on
PostgreSQL. Every state change is one SQL transaction guarded by the state it expects
(and, for a writer, the epoch it holds), so a stale writer is fenced by the database
rather than by timing.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any, Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from airflow_exactly_once.core.errors import (
    ConfigurationError,
    FencedError,
    IllegalTransitionError,
    MissingExtraError,
)
from airflow_exactly_once.core.model import Batch, BatchId, OffsetRange, dumps
from airflow_exactly_once.core.states import BatchState, check_initial, check_transition

# A batch detail: the batch is ABORTED but what it staged is still to be taken away (BatchCoordinator.release);
# None once it was.
RELEASE_PENDING = "release_pending"

metadata = sa.MetaData()

pipelines = sa.Table(
    "aeo_pipeline",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

# Where each partition started: resolved once from the startup mode (or the policy for
# partitions added later) and then fixed, so "latest" means latest when first seen.
partitions = sa.Table(
    "aeo_partition",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("topic", sa.String(249), primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True),
    sa.Column("initial_offset", sa.BigInteger, nullable=False),
    sa.Column("origin", sa.String(200), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

batches = sa.Table(
    "aeo_batch",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("batch_seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("run_id", sa.String(250), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("handles", sa.Text),
    sa.Column("input_records", sa.BigInteger),
    sa.Column("output_records", sa.BigInteger),
    sa.Column("error", sa.Text),
    sa.Column("details", sa.Text),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("aeo_batch_run", "pipeline_id", "run_id"),
    sa.Index("aeo_batch_state", "pipeline_id", "state"),
)

batch_offsets = sa.Table(
    "aeo_batch_offset",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("batch_seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("topic", sa.String(249), primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True),
    sa.Column("start_offset", sa.BigInteger, nullable=False),
    sa.Column("end_offset", sa.BigInteger, nullable=False),
)

# Decisions worth an audit trail: skipped data after data loss, no-op replays, rewinds.
events = sa.Table(
    "aeo_event",
    metadata,
    sa.Column("event_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("pipeline_id", sa.String(250), nullable=False, index=True),
    sa.Column("batch_seq", sa.BigInteger),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
)

# Where a partition's position was moved on purpose, so that committed-position logic and
# the tiling check know about it: a rewind, or data loss accepted under data_loss_policy
# "skip". Batches numbered after `after_batch_seq` continue from `new_offset`.
position_resets = sa.Table(
    "aeo_position_reset",
    metadata,
    sa.Column("reset_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("pipeline_id", sa.String(250), nullable=False, index=True),
    sa.Column("topic", sa.String(249), nullable=False),
    sa.Column("partition", sa.Integer, nullable=False),
    sa.Column("new_offset", sa.BigInteger, nullable=False),
    sa.Column("after_batch_seq", sa.BigInteger, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),  # rewind | data-loss-skip
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
)

# Interval mode: the Airflow data interval [start, end) (epoch ms) each batch reads.
batch_intervals = sa.Table(
    "aeo_batch_interval",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("batch_seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("interval_start", sa.BigInteger, nullable=False),
    sa.Column("interval_end", sa.BigInteger, nullable=False),
    sa.Index("aeo_batch_interval_key", "pipeline_id", "interval_start", "interval_end"),
)

# Interval mode: the offset at which a point in time falls in each partition, fixed the
# first time a batch needs it. Adjacent intervals share it, so they tile the partition even
# when records arrive late or runs of neighbouring intervals overlap.
boundaries = sa.Table(
    "aeo_boundary",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("topic", sa.String(249), primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True),
    sa.Column("at_ms", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("boundary_offset", sa.BigInteger, nullable=False),
    sa.Column("origin", sa.String(200), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

# Which Airflow DAGs drive a pipeline (recorded by the plan task): the ledger page shows a
# pipeline only to users who may read all of its DAGs.
pipeline_dags = sa.Table(
    "aeo_pipeline_dag",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("dag_id", sa.String(250), primary_key=True),
    sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
)

TopicPartition = tuple[str, int]
Reset = tuple[int, str]  # new offset, reason
Boundary = tuple[TopicPartition, int]  # partition, time (epoch ms)
_SCHEMA_LOCK = 0x61656F5F6C656467  # "aeo_ledg": the advisory lock key of schema creation


def _now() -> datetime:
    return datetime.now(timezone.utc)


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
    try:
        return sa.create_engine(url, pool_pre_ping=True)
    except ModuleNotFoundError as exc:  # the URL's driver, e.g. psycopg2 without the [postgres] extra
        if exc.name != "psycopg2":
            raise
        raise MissingExtraError("a PostgreSQL ledger", "postgres", exc.name) from exc


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
    try:
        engine = sa.create_engine(url, pool_pre_ping=True, connect_args=connect_args)
    except ModuleNotFoundError as exc:
        if exc.name != "psycopg2":
            raise
        raise MissingExtraError("a PostgreSQL ledger", "postgres", exc.name) from exc
    if engine.dialect.name == "postgresql":
        @sa.event.listens_for(engine, "connect")
        def _read_only_session(dbapi_conn, _record):  # pragma: no cover - driver hook
            with dbapi_conn.cursor() as cursor:
                cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            dbapi_conn.commit()
    return engine


class Ledger:
    def __init__(self, engine: Engine | str) -> None:
        self.engine = create_ledger_engine(engine) if isinstance(engine, str) else engine

    @property
    def url(self) -> str:
        """The SQLAlchemy URL, password included: for the write job's own connections (spark-submit, claim checks)."""
        return self.engine.url.render_as_string(hide_password=False)

    @classmethod
    def read_only(cls, url: str) -> "Ledger":
        """A ledger that can only be read (create_ledger_engine's `read_only`); its schema is never created."""
        return cls(create_ledger_engine(url, read_only=True))

    def has_schema(self) -> bool:
        """Whether the ledger's tables exist (a reader must not create them)."""
        return sa.inspect(self.engine).has_table(pipelines.name)

    # -- schema and pipeline -------------------------------------------------------

    def create_schema(self) -> None:
        with self.engine.begin() as conn:  # one transaction: on SQLite it holds the write lock
            if conn.dialect.name == "postgresql":
                # Tasks starting on an empty database at once would race on the catalog.
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})")
            metadata.create_all(conn)

    def ensure_pipeline(self, pipeline_id: str, fingerprint: str, config: dict[str, Any]) -> int:
        """Create the pipeline row on first use, keep its fingerprint current; return the epoch."""
        self.create_schema()
        try:
            return self._ensure_pipeline(pipeline_id, fingerprint, config)
        except sa.exc.IntegrityError:
            # Another session created the row first (PostgreSQL does not serialise the two
            # reads like SQLite's BEGIN IMMEDIATE): the row exists now, so read it again.
            return self._ensure_pipeline(pipeline_id, fingerprint, config)

    def _ensure_pipeline(self, pipeline_id: str, fingerprint: str, config: dict[str, Any]) -> int:
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(pipelines).where(pipelines.c.pipeline_id == pipeline_id)).first()
            if row is None:
                conn.execute(
                    pipelines.insert().values(
                        pipeline_id=pipeline_id, epoch=0, fingerprint=fingerprint, config=dumps(config),
                        created_at=_now(), updated_at=_now(),
                    )
                )
                return 0
            if row.fingerprint != fingerprint:
                conn.execute(
                    pipelines.update()
                    .where(pipelines.c.pipeline_id == pipeline_id)
                    .values(fingerprint=fingerprint, config=dumps(config), updated_at=_now())
                )
                self._event(conn, pipeline_id, None, "config-changed", f"configuration fingerprint is now {fingerprint}")
            return row.epoch

    def store_config(self, pipeline_id: str, config: dict[str, Any]) -> None:
        """Keep the stored settings current (servers, client options), not only the fingerprinted ones.

        A spark-submitted write reads its settings here, so a moved broker must show up.
        """
        with self.engine.begin() as conn:
            conn.execute(pipelines.update().where(pipelines.c.pipeline_id == pipeline_id)
                         .values(config=dumps(config), updated_at=_now()))

    def pipeline(self, pipeline_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(pipelines).where(pipelines.c.pipeline_id == pipeline_id)).first()
        if row is None:
            return None
        data = dict(row._mapping)
        data["config"] = json.loads(data["config"])
        return data

    def list_pipelines(self) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(sa.select(pipelines).order_by(pipelines.c.pipeline_id))]

    # -- partitions and positions --------------------------------------------------

    def initial_offsets(self, pipeline_id: str) -> dict[TopicPartition, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(partitions).where(partitions.c.pipeline_id == pipeline_id))
            return {(r.topic, r.partition): r.initial_offset for r in rows}

    def register_partitions(self, pipeline_id: str, starts: dict[TopicPartition, tuple[int, str]]) -> None:
        """Record where newly seen partitions start; partitions already known keep theirs."""
        if not starts:
            return
        with self.engine.begin() as conn:
            known = {
                (r.topic, r.partition)
                for r in conn.execute(sa.select(partitions.c.topic, partitions.c.partition)
                                      .where(partitions.c.pipeline_id == pipeline_id))
            }
            for (topic, partition), (offset, origin) in sorted(starts.items()):
                if (topic, partition) in known:
                    continue
                conn.execute(partitions.insert().values(
                    pipeline_id=pipeline_id, topic=topic, partition=partition, initial_offset=offset,
                    origin=origin, created_at=_now()))
                self._event(conn, pipeline_id, None, "partition-added",
                            f"{topic}[{partition}] starts at offset {offset} ({origin})")

    def committed_positions(self, pipeline_id: str) -> dict[TopicPartition, int]:
        """Per partition: where the next batch starts.

        The end of the newest COMMITTED batch that covers the partition, unless a recorded
        position reset (rewind, accepted data loss) came after it; else where the
        partition started. "Newest" is by batch number, not by offset, so that a rewind or
        a recreated topic moves the position back.
        """
        positions = self.initial_offsets(pipeline_id)
        newest = (
            sa.select(batch_offsets.c.topic, batch_offsets.c.partition,
                      sa.func.max(batch_offsets.c.batch_seq).label("seq"))
            .join(batches, sa.and_(batches.c.pipeline_id == batch_offsets.c.pipeline_id,
                                   batches.c.batch_seq == batch_offsets.c.batch_seq))
            .where(batch_offsets.c.pipeline_id == pipeline_id, batches.c.state == BatchState.COMMITTED.value)
            .group_by(batch_offsets.c.topic, batch_offsets.c.partition)
            .subquery()
        )
        query = (
            sa.select(batch_offsets.c.topic, batch_offsets.c.partition, batch_offsets.c.batch_seq,
                      batch_offsets.c.end_offset)
            .join(newest, sa.and_(batch_offsets.c.topic == newest.c.topic,
                                  batch_offsets.c.partition == newest.c.partition,
                                  batch_offsets.c.batch_seq == newest.c.seq))
            .where(batch_offsets.c.pipeline_id == pipeline_id)
        )
        with self.engine.connect() as conn:
            ends = {(r.topic, r.partition): (r.batch_seq, r.end_offset) for r in conn.execute(query)}
        resets = {(r["topic"], r["partition"]): r for r in self.position_resets(pipeline_id)}
        for tp in set(ends) | set(resets):
            reset, committed = resets.get(tp), ends.get(tp)
            if reset is not None and (committed is None or reset["after_batch_seq"] >= committed[0]):
                positions[tp] = reset["new_offset"]
            else:
                positions[tp] = committed[1]
        return positions

    def position_resets(self, pipeline_id: str) -> list[dict[str, Any]]:
        """Recorded position resets, oldest first."""
        query = (sa.select(position_resets).where(position_resets.c.pipeline_id == pipeline_id)
                 .order_by(position_resets.c.reset_id))
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    # -- batches -------------------------------------------------------------------

    def get_batch(self, batch_id: BatchId) -> Batch:
        with self.engine.connect() as conn:
            batch = self._load(conn, batch_id)
        if batch is None:
            raise IllegalTransitionError(f"batch {batch_id} is not in the ledger")
        return batch

    def list_batches(self, pipeline_id: str, states: Iterable[BatchState] | None = None,
                     limit: int | None = None, newest_first: bool = True) -> list[Batch]:
        query = sa.select(batches.c.batch_seq).where(batches.c.pipeline_id == pipeline_id)
        if states is not None:
            query = query.where(batches.c.state.in_([s.value for s in states]))
        order = batches.c.batch_seq.desc() if newest_first else batches.c.batch_seq.asc()
        query = query.order_by(order).limit(limit)
        with self.engine.connect() as conn:
            seqs = [r[0] for r in conn.execute(query)]
            return [self._load(conn, BatchId(pipeline_id, s)) for s in seqs]

    def latest_batch_for_run(self, pipeline_id: str, run_id: str) -> Batch | None:
        query = (sa.select(sa.func.max(batches.c.batch_seq))
                 .where(batches.c.pipeline_id == pipeline_id, batches.c.run_id == run_id))
        with self.engine.connect() as conn:
            seq = conn.execute(query).scalar()
            return None if seq is None else self._load(conn, BatchId(pipeline_id, seq))

    def create_batch(self, pipeline_id: str, run_id: str, ranges: Iterable[OffsetRange], *,
                     expected_epoch: int, supersede: Iterable[int] = (),
                     details: dict[str, Any] | None = None, state: BatchState = BatchState.PLANNED,
                     interval: tuple[int, int] | None = None,
                     resets: dict[TopicPartition, Reset] | None = None) -> Batch:
        """Take the pipeline over (epoch + 1) and record a PLANNED (or EMPTY) batch, in one transaction.

        Batches in `supersede` (PLANNED batches of other runs) are aborted in the same
        transaction, so their writers are fenced: they can no longer become PREPARED.
        `interval` ties the batch to a data interval (interval mode); `resets` records
        positions moved by data_loss_policy="skip" just before this batch.
        """
        check_initial(state)
        with self.engine.begin() as conn:
            epoch = self._bump_epoch(conn, pipeline_id, expected_epoch)
            for seq in supersede:
                old = self._require(conn, BatchId(pipeline_id, seq))
                try:  # a superseded attempt may have staged output (or still run): recovery releases it
                    self._set_state(conn, old.id, BatchState.PLANNED, BatchState.ABORTED,
                                    error=f"superseded by run {run_id}",
                                    details=dumps({**old.details, RELEASE_PENDING: True}))
                except FencedError as exc:
                    # Its write finished (PREPARED) after this run looked: plan again, recovering it first.
                    raise FencedError(f"{exc}; planning again", retriable=True) from exc
                self._event(conn, pipeline_id, seq, "superseded",
                            f"batch {seq} was still PLANNED and was taken over by run {run_id}")
            last = conn.execute(sa.select(sa.func.max(batches.c.batch_seq))
                                .where(batches.c.pipeline_id == pipeline_id)).scalar()
            seq = (last or 0) + 1
            now = _now()
            conn.execute(batches.insert().values(
                pipeline_id=pipeline_id, batch_seq=seq, run_id=run_id, state=state.value,
                epoch=epoch, details=dumps(details or {}), created_at=now, updated_at=now))
            if interval is not None:
                conn.execute(batch_intervals.insert().values(pipeline_id=pipeline_id, batch_seq=seq,
                                                             interval_start=interval[0], interval_end=interval[1]))
            self._insert_resets(conn, pipeline_id, resets or {}, seq - 1, "data-loss-skip")
            rows = [dict(pipeline_id=pipeline_id, batch_seq=seq, topic=r.topic, partition=r.partition,
                         start_offset=r.start, end_offset=r.end) for r in sorted(ranges)]
            if rows:
                conn.execute(batch_offsets.insert(), rows)
            return self._load(conn, BatchId(pipeline_id, seq))

    def claim(self, batch_id: BatchId) -> Batch:
        """A write attempt takes the batch over: a new epoch fences any older attempt."""
        with self.engine.begin() as conn:
            current = self._require(conn, batch_id)
            if current.state is not BatchState.PLANNED:
                raise FencedError(f"batch {batch_id} is {current.state.value}, not PLANNED; "
                                  "another run or attempt has taken it over")
            pipeline_epoch = conn.execute(sa.select(pipelines.c.epoch)
                                          .where(pipelines.c.pipeline_id == batch_id.pipeline_id)).scalar()
            epoch = self._bump_epoch(conn, batch_id.pipeline_id, pipeline_epoch)
            result = conn.execute(
                batches.update()
                .where(batches.c.pipeline_id == batch_id.pipeline_id, batches.c.batch_seq == batch_id.seq,
                       batches.c.state == BatchState.PLANNED.value, batches.c.epoch == current.epoch)
                .values(epoch=epoch, updated_at=_now()))
            if result.rowcount != 1:
                raise FencedError(f"batch {batch_id} changed while being claimed", retriable=True)
            return self._load(conn, batch_id)

    def mark_prepared(self, batch_id: BatchId, epoch: int, handles: dict[str, Any],
                      input_records: int | None, output_records: int | None,
                      details: dict[str, Any] | None = None) -> Batch:
        """PLANNED -> PREPARED by the attempt holding `epoch`; `details` are merged into the batch's."""
        with self.engine.begin() as conn:
            values: dict[str, Any] = {"handles": dumps(handles), "input_records": input_records,
                                      "output_records": output_records}
            if details:
                values["details"] = dumps({**self._require(conn, batch_id).details, **details})
            self._set_state(conn, batch_id, BatchState.PLANNED, BatchState.PREPARED, epoch=epoch, **values)
            return self._load(conn, batch_id)

    def mark_committed(self, batch_id: BatchId, retracts: Iterable[int] = ()) -> bool:
        """PREPARED -> COMMITTED; False (no change) when it already is COMMITTED.

        Batches in `retracts` (whose output the sink has just replaced by this batch's)
        go COMMITTED -> RETRACTED in the same transaction.
        """
        with self.engine.begin() as conn:
            current = self._require(conn, batch_id)
            if current.state is BatchState.COMMITTED:
                return False
            self._set_state(conn, batch_id, BatchState.PREPARED, BatchState.COMMITTED)
            for seq in retracts:
                old = self._require(conn, BatchId(batch_id.pipeline_id, seq))
                if old.state is BatchState.COMMITTED:
                    self._set_state(conn, old.id, BatchState.COMMITTED, BatchState.RETRACTED,
                                    error=f"replaced by batch {batch_id.seq}",
                                    details=dumps({**old.details, "output_retracted": True}))
                    self._event(conn, batch_id.pipeline_id, seq, "replaced",
                                f"batch {seq}'s output was replaced by batch {batch_id.seq} (same data interval)")
            return True

    def mark_aborted(self, batch_id: BatchId, reason: str, *, from_state: BatchState = BatchState.PLANNED,
                     release_pending: bool = False) -> bool:
        """`from_state` -> ABORTED; False (no change) when it already is ABORTED.

        `release_pending`: what the batch staged is still to be taken away (`pending_releases`), so that
        a process that dies before it did leaves the work to the next run's recovery.
        """
        with self.engine.begin() as conn:
            current = self._require(conn, batch_id)
            if current.state is BatchState.ABORTED:
                return False
            values: dict[str, Any] = {"error": reason[:4000]}
            if release_pending:
                values["details"] = dumps({**current.details, RELEASE_PENDING: True})
            self._set_state(conn, batch_id, from_state, BatchState.ABORTED, **values)
            self._event(conn, batch_id.pipeline_id, batch_id.seq, "aborted", reason[:4000])
            return True

    def pending_releases(self, pipeline_id: str) -> list[Batch]:
        """ABORTED batches whose staged output (transactions, folders, snapshots) was not yet taken away."""
        query = (sa.select(batches.c.batch_seq)
                 .where(batches.c.pipeline_id == pipeline_id, batches.c.state == BatchState.ABORTED.value,
                        batches.c.details.contains(f'"{RELEASE_PENDING}"'))
                 .order_by(batches.c.batch_seq))
        with self.engine.connect() as conn:
            found = [self._load(conn, BatchId(pipeline_id, r[0])) for r in conn.execute(query)]
        return [b for b in found if b is not None and b.details.get(RELEASE_PENDING)]

    def update_details(self, batch_id: BatchId, **details: Any) -> None:
        with self.engine.begin() as conn:
            current = self._require(conn, batch_id)
            merged = {**current.details, **details}
            conn.execute(batches.update()
                         .where(batches.c.pipeline_id == batch_id.pipeline_id, batches.c.batch_seq == batch_id.seq)
                         .values(details=dumps(merged), updated_at=_now()))

    # -- rewinds and retractions ---------------------------------------------------

    def rewind(self, pipeline_id: str, *, expected_epoch: int, retract: Iterable[int],
               resets: dict[TopicPartition, Reset], reason: str) -> int:
        """Move positions back (and withdraw committed batches) in one transaction; returns the epoch.

        Refuses while a batch is in flight. Taking the pipeline over (epoch + 1) makes a
        run that planned from the old positions fail its compare-and-set and plan again.
        Retracted batches keep `output_retracted: false` until the sink has removed their
        output; the next plan's recovery finishes that if this process dies first.
        """
        with self.engine.begin() as conn:
            busy = conn.execute(sa.select(batches.c.batch_seq, batches.c.state, batches.c.run_id)
                                .where(batches.c.pipeline_id == pipeline_id,
                                       batches.c.state.in_([BatchState.PLANNED.value, BatchState.PREPARED.value]))
                                ).first()
            if busy is not None:
                raise FencedError(f"batch {busy.batch_seq} of run {busy.run_id} is {busy.state}: a rewind must not "
                                  "move offsets under a batch in flight; let that run finish (or fail and abort) "
                                  "and rewind again")
            epoch = self._bump_epoch(conn, pipeline_id, expected_epoch)
            last = conn.execute(sa.select(sa.func.max(batches.c.batch_seq))
                                .where(batches.c.pipeline_id == pipeline_id)).scalar() or 0
            for seq in retract:
                old = self._require(conn, BatchId(pipeline_id, seq))
                self._set_state(conn, old.id, BatchState.COMMITTED, BatchState.RETRACTED, error=f"rewound: {reason}",
                                details=dumps({**old.details, "output_retracted": False}))
            self._insert_resets(conn, pipeline_id, resets, last, "rewind")
            retracted = ", ".join(str(seq) for seq in retract) or "none"
            self._event(conn, pipeline_id, None, "rewind", f"{reason}; batches retracted: {retracted}")
            return epoch

    def pending_retractions(self, pipeline_id: str) -> list[Batch]:
        """RETRACTED batches whose output the sink has not confirmed removed yet."""
        return [b for b in self.list_batches(pipeline_id, [BatchState.RETRACTED], newest_first=False)
                if not b.details.get("output_retracted", True)]

    # -- interval mode --------------------------------------------------------------

    def batch_interval(self, batch_id: BatchId) -> tuple[int, int] | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(batch_intervals.c.interval_start, batch_intervals.c.interval_end)
                               .where(batch_intervals.c.pipeline_id == batch_id.pipeline_id,
                                      batch_intervals.c.batch_seq == batch_id.seq)).first()
        return None if row is None else (row[0], row[1])

    def interval_batches(self, pipeline_id: str, interval: tuple[int, int] | None = None) -> list[Batch]:
        """Batches tied to `interval` (or to any interval), newest first."""
        query = sa.select(batch_intervals.c.batch_seq).where(batch_intervals.c.pipeline_id == pipeline_id)
        if interval is not None:
            query = query.where(batch_intervals.c.interval_start == interval[0],
                                batch_intervals.c.interval_end == interval[1])
        with self.engine.connect() as conn:
            seqs = sorted((r[0] for r in conn.execute(query)), reverse=True)
            return [self._load(conn, BatchId(pipeline_id, seq)) for seq in seqs]

    def count_batches(self, pipeline_id: str, *, with_interval: bool) -> int:
        """How many batches were planned by interval (True) or by continuation (False)."""
        tied = sa.select(batch_intervals.c.batch_seq).where(batch_intervals.c.pipeline_id == pipeline_id)
        query = sa.select(sa.func.count()).select_from(batches).where(
            batches.c.pipeline_id == pipeline_id,
            batches.c.batch_seq.in_(tied) if with_interval else batches.c.batch_seq.not_in(tied))
        with self.engine.connect() as conn:
            return conn.execute(query).scalar() or 0

    def fix_boundaries(self, pipeline_id: str, wanted: dict[Boundary, tuple[int, str]]) -> dict[Boundary, int]:
        """The offset of each (partition, time); the first answer recorded wins, for good.

        A new boundary is kept between the recorded boundaries before and after it in
        time, so boundaries never cross even if Kafka's answer changed in between.
        """
        try:
            return self._fix_boundaries(pipeline_id, wanted)
        except sa.exc.IntegrityError as exc:  # another run recorded one of them at the same moment
            raise FencedError(f"another run fixed the same interval boundaries of {pipeline_id} concurrently "
                              f"({exc.orig}); planning again", retriable=True) from exc

    def _fix_boundaries(self, pipeline_id: str, wanted: dict[Boundary, tuple[int, str]]) -> dict[Boundary, int]:
        result: dict[Boundary, int] = {}
        with self.engine.begin() as conn:
            for ((topic, partition), at), (candidate, origin) in sorted(wanted.items()):
                key = (boundaries.c.pipeline_id == pipeline_id, boundaries.c.topic == topic,
                       boundaries.c.partition == partition)
                recorded = conn.execute(sa.select(boundaries.c.boundary_offset)
                                        .where(*key, boundaries.c.at_ms == at)).scalar()
                if recorded is None:
                    below = conn.execute(sa.select(boundaries.c.boundary_offset).where(*key, boundaries.c.at_ms < at)
                                         .order_by(boundaries.c.at_ms.desc()).limit(1)).scalar()
                    above = conn.execute(sa.select(boundaries.c.boundary_offset).where(*key, boundaries.c.at_ms > at)
                                         .order_by(boundaries.c.at_ms.asc()).limit(1)).scalar()
                    recorded = candidate if below is None else max(candidate, below)
                    recorded = recorded if above is None else min(recorded, above)
                    conn.execute(boundaries.insert().values(
                        pipeline_id=pipeline_id, topic=topic, partition=partition, at_ms=at,
                        boundary_offset=recorded, origin=origin[:200], created_at=_now()))
                result[((topic, partition), at)] = recorded
        return result

    def list_boundaries(self, pipeline_id: str) -> dict[Boundary, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(boundaries).where(boundaries.c.pipeline_id == pipeline_id))
            return {((r.topic, r.partition), r.at_ms): r.boundary_offset for r in rows}

    # -- the DAGs that drive a pipeline ---------------------------------------------

    def record_dag(self, pipeline_id: str, dag_id: str) -> None:
        """Remember that `dag_id` drives `pipeline_id` (once; later calls read only)."""
        key = (pipeline_dags.c.pipeline_id == pipeline_id, pipeline_dags.c.dag_id == dag_id)
        with self.engine.connect() as conn:
            if conn.execute(sa.select(pipeline_dags.c.dag_id).where(*key)).first() is not None:
                return
        try:
            with self.engine.begin() as conn:
                if conn.execute(sa.select(pipeline_dags.c.dag_id).where(*key)).first() is None:
                    conn.execute(pipeline_dags.insert().values(pipeline_id=pipeline_id, dag_id=dag_id,
                                                               first_seen_at=_now()))
        except sa.exc.IntegrityError:
            pass  # another task recorded the same pair at the same moment

    def pipeline_dags(self) -> dict[str, set[str]]:
        """{pipeline_id: the DAG ids recorded for it} (pipelines without any are left out)."""
        found: dict[str, set[str]] = {}
        with self.engine.connect() as conn:
            for row in conn.execute(sa.select(pipeline_dags.c.pipeline_id, pipeline_dags.c.dag_id)):
                found.setdefault(row.pipeline_id, set()).add(row.dag_id)
        return found

    def run_ids(self, pipeline_id: str) -> set[str]:
        """Every Airflow run id that recorded a batch of the pipeline."""
        with self.engine.connect() as conn:
            return {r[0] for r in conn.execute(sa.select(batches.c.run_id).distinct()
                                               .where(batches.c.pipeline_id == pipeline_id))}

    def state_counts(self, pipeline_id: str) -> dict[str, int]:
        """{state: how many batches of the pipeline are in it}."""
        query = (sa.select(batches.c.state, sa.func.count()).where(batches.c.pipeline_id == pipeline_id)
                 .group_by(batches.c.state))
        with self.engine.connect() as conn:
            return {state: count for state, count in conn.execute(query)}

    def last_batch_seq(self, pipeline_id: str) -> int:
        """The newest batch number of the pipeline (0 before its first batch)."""
        with self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.max(batches.c.batch_seq))
                                .where(batches.c.pipeline_id == pipeline_id)).scalar() or 0

    # -- events --------------------------------------------------------------------

    def record_event(self, pipeline_id: str, batch_seq: int | None, kind: str, message: str) -> None:
        with self.engine.begin() as conn:
            self._event(conn, pipeline_id, batch_seq, kind, message)

    def list_events(self, pipeline_id: str, limit: int = 100) -> list[dict[str, Any]]:
        query = (sa.select(events).where(events.c.pipeline_id == pipeline_id)
                 .order_by(events.c.event_id.desc()).limit(limit))
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    # -- internals -----------------------------------------------------------------

    @staticmethod
    def _event(conn: Connection, pipeline_id: str, batch_seq: int | None, kind: str, message: str) -> None:
        conn.execute(events.insert().values(pipeline_id=pipeline_id, batch_seq=batch_seq, kind=kind,
                                            message=message, at=_now()))

    @classmethod
    def _insert_resets(cls, conn: Connection, pipeline_id: str, resets: dict[TopicPartition, Reset],
                       after_seq: int, kind: str) -> None:
        for (topic, partition), (offset, reason) in sorted(resets.items()):
            conn.execute(position_resets.insert().values(
                pipeline_id=pipeline_id, topic=topic, partition=partition, new_offset=offset,
                after_batch_seq=after_seq, kind=kind, reason=reason[:4000], at=_now()))
            cls._event(conn, pipeline_id, None, kind, f"{topic}[{partition}] continues at offset {offset}: {reason}")

    @staticmethod
    def _bump_epoch(conn: Connection, pipeline_id: str, expected_epoch: int) -> int:
        result = conn.execute(pipelines.update()
                              .where(pipelines.c.pipeline_id == pipeline_id, pipelines.c.epoch == expected_epoch)
                              .values(epoch=expected_epoch + 1, updated_at=_now()))
        if result.rowcount != 1:
            raise FencedError(f"pipeline {pipeline_id} was taken over concurrently (epoch is no longer "
                              f"{expected_epoch}); planning again", retriable=True)
        return expected_epoch + 1

    def _set_state(self, conn: Connection, batch_id: BatchId, expected: BatchState, target: BatchState,
                   epoch: int | None = None, **values: Any) -> None:
        check_transition(expected, target)
        where = [batches.c.pipeline_id == batch_id.pipeline_id, batches.c.batch_seq == batch_id.seq,
                 batches.c.state == expected.value]
        if epoch is not None:
            where.append(batches.c.epoch == epoch)
        result = conn.execute(batches.update().where(*where).values(state=target.value, updated_at=_now(), **values))
        if result.rowcount == 1:
            return
        current = self._require(conn, batch_id)
        if epoch is not None and current.epoch != epoch:
            raise FencedError(f"batch {batch_id} is held by epoch {current.epoch}, this writer holds {epoch}: "
                              "a newer attempt or run took it over")
        raise FencedError(f"batch {batch_id} is {current.state.value}, expected {expected.value}: "
                          "another run or attempt changed it")

    def _require(self, conn: Connection, batch_id: BatchId) -> Batch:
        batch = self._load(conn, batch_id)
        if batch is None:
            raise IllegalTransitionError(f"batch {batch_id} is not in the ledger")
        return batch

    @staticmethod
    def _load(conn: Connection, batch_id: BatchId) -> Batch | None:
        row = conn.execute(sa.select(batches).where(batches.c.pipeline_id == batch_id.pipeline_id,
                                                    batches.c.batch_seq == batch_id.seq)).first()
        if row is None:
            return None
        offsets = conn.execute(sa.select(batch_offsets)
                               .where(batch_offsets.c.pipeline_id == batch_id.pipeline_id,
                                      batch_offsets.c.batch_seq == batch_id.seq))
        ranges = tuple(sorted(OffsetRange(o.topic, o.partition, o.start_offset, o.end_offset) for o in offsets))
        return Batch(
            pipeline_id=row.pipeline_id, seq=row.batch_seq, run_id=row.run_id, state=BatchState(row.state),
            epoch=row.epoch, ranges=ranges, handles=json.loads(row.handles) if row.handles else None,
            input_records=row.input_records, output_records=row.output_records, error=row.error,
            created_at=row.created_at, updated_at=row.updated_at,
            details=json.loads(row.details) if row.details else {},
        )
