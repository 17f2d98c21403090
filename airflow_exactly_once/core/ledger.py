"""The offset ledger: the only source of truth for what has been committed.

Plain SQLAlchemy Core, so the same code runs on the embedded SQLite file and on
PostgreSQL. Every state change is one SQL transaction guarded by the state it expects
(and, for a writer, the epoch it holds), so a stale writer is fenced by the database
rather than by timing.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from airflow_exactly_once.core.errors import FencedError, IllegalTransitionError
from airflow_exactly_once.core.model import Batch, BatchId, OffsetRange, dumps
from airflow_exactly_once.core.states import BatchState, check_transition

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

TopicPartition = tuple[str, int]
_SCHEMA_LOCK = 0x61656F5F6C656467  # "aeo_ledg": the advisory lock key of schema creation


def _now() -> datetime:
    return datetime.now(timezone.utc)


def create_ledger_engine(url: str) -> Engine:
    """An engine whose write transactions serialize properly on SQLite as well."""
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
    return sa.create_engine(url, pool_pre_ping=True)


class Ledger:
    def __init__(self, engine: Engine | str) -> None:
        self.engine = create_ledger_engine(engine) if isinstance(engine, str) else engine

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
        """Per partition, the end offset of the committed ranges (else where it started)."""
        positions = self.initial_offsets(pipeline_id)
        query = (
            sa.select(batch_offsets.c.topic, batch_offsets.c.partition, sa.func.max(batch_offsets.c.end_offset))
            .join(batches, sa.and_(batches.c.pipeline_id == batch_offsets.c.pipeline_id,
                                   batches.c.batch_seq == batch_offsets.c.batch_seq))
            .where(batch_offsets.c.pipeline_id == pipeline_id, batches.c.state == BatchState.COMMITTED.value)
            .group_by(batch_offsets.c.topic, batch_offsets.c.partition)
        )
        with self.engine.connect() as conn:
            for topic, partition, end in conn.execute(query):
                positions[(topic, partition)] = end
        return positions

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
                     details: dict[str, Any] | None = None) -> Batch:
        """Take the pipeline over (epoch + 1) and record a PLANNED batch, in one transaction.

        Batches in `supersede` (PLANNED batches of other runs) are aborted in the same
        transaction, so their writers are fenced: they can no longer become PREPARED.
        """
        with self.engine.begin() as conn:
            epoch = self._bump_epoch(conn, pipeline_id, expected_epoch)
            for seq in supersede:
                self._set_state(conn, BatchId(pipeline_id, seq), BatchState.PLANNED, BatchState.ABORTED,
                                error=f"superseded by run {run_id}")
                self._event(conn, pipeline_id, seq, "superseded",
                            f"batch {seq} was still PLANNED and was taken over by run {run_id}")
            last = conn.execute(sa.select(sa.func.max(batches.c.batch_seq))
                                .where(batches.c.pipeline_id == pipeline_id)).scalar()
            seq = (last or 0) + 1
            now = _now()
            conn.execute(batches.insert().values(
                pipeline_id=pipeline_id, batch_seq=seq, run_id=run_id, state=BatchState.PLANNED.value,
                epoch=epoch, details=dumps(details or {}), created_at=now, updated_at=now))
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
                      input_records: int | None, output_records: int | None) -> Batch:
        with self.engine.begin() as conn:
            self._set_state(conn, batch_id, BatchState.PLANNED, BatchState.PREPARED, epoch=epoch,
                            handles=dumps(handles), input_records=input_records, output_records=output_records)
            return self._load(conn, batch_id)

    def mark_committed(self, batch_id: BatchId) -> bool:
        """PREPARED -> COMMITTED; False (no change) when it already is COMMITTED."""
        with self.engine.begin() as conn:
            current = self._require(conn, batch_id)
            if current.state is BatchState.COMMITTED:
                return False
            self._set_state(conn, batch_id, BatchState.PREPARED, BatchState.COMMITTED)
            return True

    def mark_aborted(self, batch_id: BatchId, reason: str, *, from_state: BatchState = BatchState.PLANNED) -> bool:
        """`from_state` -> ABORTED; False (no change) when it already is ABORTED."""
        with self.engine.begin() as conn:
            current = self._require(conn, batch_id)
            if current.state is BatchState.ABORTED:
                return False
            self._set_state(conn, batch_id, from_state, BatchState.ABORTED, error=reason[:4000])
            self._event(conn, batch_id.pipeline_id, batch_id.seq, "aborted", reason[:4000])
            return True

    def update_details(self, batch_id: BatchId, **details: Any) -> None:
        with self.engine.begin() as conn:
            current = self._require(conn, batch_id)
            merged = {**current.details, **details}
            conn.execute(batches.update()
                         .where(batches.c.pipeline_id == batch_id.pipeline_id, batches.c.batch_seq == batch_id.seq)
                         .values(details=dumps(merged), updated_at=_now()))

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
