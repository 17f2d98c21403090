"""The SQL every concern of the ledger shares inside its transactions, as functions of a connection.

Reading a batch, the committed positions and the retention floor, writing a batch row, the epoch fence:
each concern (`pipeline`, `position`, `batch`, `interval`, `retention`) runs these inside its own transaction,
so they take the `Connection` rather than the ledger, and a call names this module (`rows.load(conn, ...)`),
so a reader sees where each is defined. What needs the ledger object itself (its engine, the secrets it
scrubs from what it writes: events, the compare-and-set of a batch's state) stays on `base.LedgerBase`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from airflow_exactly_once.core.errors import FencedError, IllegalTransitionError
from airflow_exactly_once.core.ledger.schema import (
    TopicPartition,
    batch_offsets,
    batches,
    partition_floors,
    partitions,
    pipelines,
    position_resets,
    prune_floors,
)
from airflow_exactly_once.core.model import Batch, BatchId, OffsetRange
from airflow_exactly_once.core.states import BatchState

# How many committed batches one read of the newest ones takes at most (committed positions).
_NEWEST_PAGE = 32


@dataclass(frozen=True)
class Floor:
    """What retention pruned of a pipeline: its batches up to `batch_seq`, and per partition the committed position
    right after them (`offsets`); `interval_end`: the latest data-interval end among them (interval mode);
    `batch_created_at`: when batch `batch_seq` was planned."""

    batch_seq: int = 0
    interval_end: int | None = None
    pruned_batches: int = 0
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    batch_created_at: datetime | None = None


def utc_now() -> datetime:
    """The time every ledger row records (aware, UTC)."""
    return datetime.now(timezone.utc)


def bump_epoch(conn: Connection, pipeline_id: str, expected_epoch: int) -> int:
    result = conn.execute(pipelines.update()
                          .where(pipelines.c.pipeline_id == pipeline_id, pipelines.c.epoch == expected_epoch)
                          .values(epoch=expected_epoch + 1, updated_at=utc_now()))
    if result.rowcount != 1:
        raise FencedError(f"pipeline {pipeline_id} was taken over concurrently (epoch is no longer "
                          f"{expected_epoch}); planning again", retriable=True)
    return expected_epoch + 1


def floor(conn: Connection, pipeline_id: str) -> Floor:
    """The pipeline's retention floor (batch 0, no offsets, when nothing was pruned)."""
    row = conn.execute(sa.select(prune_floors).where(prune_floors.c.pipeline_id == pipeline_id)).first()
    if row is None:
        return Floor()
    offsets = {(r.topic, r.partition): r.floor_offset for r in conn.execute(
        sa.select(partition_floors).where(partition_floors.c.pipeline_id == pipeline_id))}
    return Floor(row.batch_seq, row.interval_end, row.pruned_batches, offsets, row.batch_created_at)


def positions(conn: Connection, pipeline_id: str, through: int | None = None) -> dict[TopicPartition, int]:
    """Per partition, where the next batch starts (after batch `through`, default: the newest).

    The latest of: where the partition started, the retention floor, the end of the newest COMMITTED
    batch covering it, a position reset recorded after that batch. "Latest" is by batch number, not by
    offset, so that a rewind or a recreated topic moves the position back. The newest committed batches
    are read newest first, a page at a time, until every known partition is found: in steady state one
    page, however long the history.
    """
    positions = {(r.topic, r.partition): r.initial_offset for r in conn.execute(
        sa.select(partitions).where(partitions.c.pipeline_id == pipeline_id))}
    pruned = floor(conn, pipeline_id)
    # Each candidate is (order, offset): batch n at n, a reset recorded after batch n at n + 0.5.
    latest: dict[TopicPartition, tuple[float, int]] = {tp: (pruned.batch_seq, o) for tp, o in pruned.offsets.items()}
    wanted = set(positions) | set(latest)
    found: dict[TopicPartition, tuple[float, int]] = {}
    below = through + 1 if through is not None else None
    # The newest batch alone first: it covers every partition when each batch has a range for each (the steady
    # state), and a page of 32 would read 32 rows per partition (32,000 of a 1,000-partition topic). Pages grow
    # from there, so a partition last covered long ago costs a few more queries, not a row per batch.
    page = 1
    while True:
        query = (sa.select(batches.c.batch_seq)
                 .where(batches.c.pipeline_id == pipeline_id, batches.c.state == BatchState.COMMITTED.value,
                        batches.c.batch_seq > pruned.batch_seq)
                 .order_by(batches.c.batch_seq.desc()).limit(page))
        if below is not None:
            query = query.where(batches.c.batch_seq < below)
        # The page's batches with their ranges in one statement (a batch without ranges still shows, once).
        newest = query.subquery()
        rows = conn.execute(sa.select(newest.c.batch_seq, batch_offsets.c.topic, batch_offsets.c.partition,
                                      batch_offsets.c.end_offset)
                            .select_from(newest.outerjoin(batch_offsets, sa.and_(
                                batch_offsets.c.pipeline_id == pipeline_id,
                                batch_offsets.c.batch_seq == newest.c.batch_seq)))).all()
        seqs = sorted({row.batch_seq for row in rows}, reverse=True)
        if not seqs:
            break
        for row in sorted(rows, key=lambda r: -r.batch_seq):
            if row.topic is not None:
                found.setdefault((row.topic, row.partition), (row.batch_seq, row.end_offset))
        if not wanted:  # partitions never registered (batches recorded directly): the newest batch names them
            wanted = set(found)
        if wanted <= set(found) or len(seqs) < page:
            break
        below = seqs[-1]
        page = min(page * 4, _NEWEST_PAGE)
    latest.update(found)
    resets = sa.select(position_resets).where(position_resets.c.pipeline_id == pipeline_id)
    if through is not None:
        resets = resets.where(position_resets.c.after_batch_seq < through)
    for reset in conn.execute(resets.order_by(position_resets.c.reset_id)):
        tp, order = (reset.topic, reset.partition), reset.after_batch_seq + 0.5
        if tp not in latest or order >= latest[tp][0]:  # of two resets after one batch, the later wins
            latest[tp] = (order, reset.new_offset)
    positions.update({tp: offset for tp, (_, offset) in latest.items()})
    return positions


def last_seq(conn: Connection, pipeline_id: str) -> int:
    """The newest batch number of the pipeline (0 before its first batch)."""
    return conn.execute(sa.select(sa.func.max(batches.c.batch_seq))
                        .where(batches.c.pipeline_id == pipeline_id)).scalar() or 0


def require(conn: Connection, batch_id: BatchId) -> Batch:
    batch = load(conn, batch_id)
    if batch is None:
        raise IllegalTransitionError(f"batch {batch_id} is not in the ledger")
    return batch


def load(conn: Connection, batch_id: BatchId) -> Batch | None:
    found = load_many(conn, batch_id.pipeline_id, [batch_id.seq])
    return found[0] if found else None


def load_many(conn: Connection, pipeline_id: str, seqs: list[int]) -> list[Batch]:
    """The batches numbered `seqs`, in that order (missing ones left out): two queries however many."""
    if not seqs:
        return []
    rows = {r.batch_seq: r for r in conn.execute(sa.select(batches).where(batches.c.pipeline_id == pipeline_id,
                                                                           batches.c.batch_seq.in_(seqs)))}
    ranges: dict[int, list[OffsetRange]] = {}
    for o in conn.execute(sa.select(batch_offsets).where(batch_offsets.c.pipeline_id == pipeline_id,
                                                         batch_offsets.c.batch_seq.in_(list(rows)))):
        ranges.setdefault(o.batch_seq, []).append(OffsetRange(o.topic, o.partition, o.start_offset, o.end_offset))
    return [batch_of(row, ranges.get(seq, ())) for seq in seqs if (row := rows.get(seq)) is not None]


def batch_of(row: Any, ranges: Iterable[OffsetRange]) -> Batch:
    """The Batch of an aeo_batch row (read, or returned by the statement that wrote it) and its ranges."""
    return Batch(
        pipeline_id=row.pipeline_id, seq=row.batch_seq, run_id=row.run_id, state=BatchState(row.state),
        epoch=row.epoch, ranges=tuple(sorted(ranges)),
        handles=json.loads(row.handles) if row.handles else None,
        input_records=row.input_records, output_records=row.output_records, error=row.error,
        created_at=row.created_at, updated_at=row.updated_at,
        details=json.loads(row.details) if row.details else {},
    )


def write_row(conn: Connection, statement: Any) -> tuple[int, Any]:
    """Run an INSERT or UPDATE of one aeo_batch row: (rows it changed, the row as written, or None).

    With RETURNING (PostgreSQL; SQLite 3.35 and later) the row comes back with the statement, sparing the read
    that loading the batch after it would cost (the caller knows the ranges); without, the row is None and the
    caller loads the batch.
    """
    returning = conn.dialect.insert_returning if statement.is_insert else conn.dialect.update_returning
    if not returning:
        return conn.execute(statement).rowcount, None
    row = conn.execute(statement.returning(*batches.c)).first()
    return (0, None) if row is None else (1, row)


def ranges_of(conn: Connection, batch_id: BatchId) -> list[OffsetRange]:
    return [OffsetRange(o.topic, o.partition, o.start_offset, o.end_offset) for o in conn.execute(
        sa.select(batch_offsets).where(batch_offsets.c.pipeline_id == batch_id.pipeline_id,
                                       batch_offsets.c.batch_seq == batch_id.seq))]
