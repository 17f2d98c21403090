"""Retention in the ledger: how far a pipeline's history may be pruned, and pruning it one small transaction at a time.

What is pruned is always a prefix of the pipeline's batches (numbers 1..n), so one number says what
is gone, and the floor (rows.Floor) keeps per partition the committed position right after it. Each
transaction moves the floor and deletes the batches below it with their offset ranges, data
intervals, events and folded position resets together: a process killed between two transactions
leaves a smaller but whole ledger. The limit is checked again inside each transaction, so a batch
planned meanwhile is never pruned under its run; in interval mode each transaction also takes the
pipeline over (epoch + 1), so a re-run that read an interval's batches before is planned again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from airflow_exactly_once.core.ledger import rows
from airflow_exactly_once.core.ledger.base import LedgerBase
from airflow_exactly_once.core.ledger.rows import Floor, utc_now
from airflow_exactly_once.core.ledger.batch import RELEASE_PENDING
from airflow_exactly_once.core.ledger.schema import (
    batch_intervals,
    batch_offsets,
    batches,
    events,
    partition_floors,
    pipelines,
    position_resets,
    prune_floors,
)
from airflow_exactly_once.core.model import REPLACES
from airflow_exactly_once.core.states import BatchState

IN_FLIGHT = (BatchState.PLANNED.value, BatchState.PREPARED.value)


@dataclass(frozen=True)
class Keep:
    """What retention keeps: the newest `batches` batches, and those planned at or after `since`.

    A batch is pruned only when neither keeps it; None for both keeps everything.
    """

    batches: int | None = None
    since: datetime | None = None

    @property
    def everything(self) -> bool:
        return self.batches is None and self.since is None


@dataclass
class Pruned:
    """Rows one prune removed (or, in a dry run, would remove); `through`: the floor batch afterwards."""

    through: int = 0
    batches: int = 0
    offset_rows: int = 0
    events: int = 0
    resets: int = 0
    transactions: int = 0

    def add(self, other: "Pruned") -> None:
        self.through = max(self.through, other.through)
        for name in ("batches", "offset_rows", "events", "resets", "transactions"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


class RetentionLedger(LedgerBase):
    """The prune limit, pruning in chunks, and counting what a prune would remove."""

    def prune_bounds(self, pipeline_id: str, keep: Keep, min_batches: int = 1) -> tuple[int, int]:
        """(the floor: the newest batch pruned so far, the highest batch number that may be pruned now), the
        second the floor when fewer than `min_batches` may go; one read of the floor for both.

        The limit is never above the newest batch less `keep.batches`; when that leaves fewer than `min_batches`
        above the floor (after most commits: notify_complete waits for AUTO_PRUNE_MIN), the limit's other
        queries are not asked.
        """
        with self._reading() as conn:
            floor = rows.floor(conn, pipeline_id)
            if keep.batches is not None:
                highest = rows.last_seq(conn, pipeline_id) - keep.batches
                if highest - floor.batch_seq < min_batches:
                    return floor.batch_seq, floor.batch_seq
            return floor.batch_seq, self._limit(conn, pipeline_id, keep, floor)

    def prune_chunk(self, pipeline_id: str, keep: Keep, max_batches: int) -> Pruned:
        """Prune at most `max_batches` more batches in one transaction (nothing when the floor is at the limit)."""
        with self.engine.begin() as conn:  # on SQLite: the write lock, so the limit cannot move under it
            if conn.execute(sa.select(batch_intervals.c.batch_seq)
                            .where(batch_intervals.c.pipeline_id == pipeline_id).limit(1)).first() is not None:
                # Interval mode: a plan that read an interval's batches before this prune (and may replace one it
                # removes) must plan again. First, so that on PostgreSQL a plan that got the pipeline row first
                # is seen by the limit below, and one that comes later waits and fails its compare-and-set.
                conn.execute(pipelines.update().where(pipelines.c.pipeline_id == pipeline_id)
                             .values(epoch=pipelines.c.epoch + 1, updated_at=utc_now()))
            floor = rows.floor(conn, pipeline_id)
            through = min(self._limit(conn, pipeline_id, keep, floor), floor.batch_seq + max_batches)
            if through <= floor.batch_seq:
                return Pruned(through=floor.batch_seq)
            return self._prune(conn, pipeline_id, floor, through)

    def prune_counts(self, pipeline_id: str, through: int) -> Pruned:
        """What pruning up to batch `through` would remove (a dry run); changes nothing."""
        with self._reading() as conn:
            floor = rows.floor(conn, pipeline_id)
            if through <= floor.batch_seq:
                return Pruned(through=floor.batch_seq)
            gone = self._range(batches, pipeline_id, floor, through)
            return Pruned(
                through=through,
                batches=self._count(conn, batches, gone),
                offset_rows=self._count(conn, batch_offsets, self._range(batch_offsets, pipeline_id, floor, through)),
                events=sum(self._count(conn, events, where) for where in self._events_gone(conn, pipeline_id, through)),
                resets=self._count(conn, position_resets, (position_resets.c.pipeline_id == pipeline_id,
                                                           position_resets.c.after_batch_seq < through)))

    # -- inside a transaction -----------------------------------------------------------

    @classmethod
    def _limit(cls, conn: Connection, pipeline_id: str, keep: Keep, floor: Floor) -> int:
        """Below every batch pruning must keep: the newest COMMITTED one, anything in flight, anything whose
        withdrawal or release is pending, any batch an in-flight re-run replaces, and what `keep` keeps."""
        if keep.everything:
            return floor.batch_seq
        key = batches.c.pipeline_id == pipeline_id

        def lowest(*where) -> int | None:
            return conn.execute(sa.select(sa.func.min(batches.c.batch_seq)).where(key, *where)).scalar()

        newest_committed = conn.execute(
            sa.select(batches.c.batch_seq).where(key, batches.c.state == BatchState.COMMITTED.value)
            .order_by(batches.c.batch_seq.desc()).limit(1)).scalar()
        if newest_committed is None:
            return floor.batch_seq
        bounds = [newest_committed]
        details = batches.c.details
        bounds += [seq for seq in (
            lowest(batches.c.state.in_(IN_FLIGHT)),
            lowest(batches.c.state == BatchState.RETRACTED.value, details.contains('"output_retracted":false')),
            lowest(batches.c.state == BatchState.ABORTED.value, details.contains(f'"{RELEASE_PENDING}":true')),
        ) if seq is not None]
        for (details,) in conn.execute(sa.select(batches.c.details).where(key, batches.c.state.in_(IN_FLIGHT))):
            replaces = json.loads(details or "{}").get(REPLACES)
            if replaces is not None:  # an interval re-run commits by withdrawing that batch's output
                bounds.append(int(replaces))
        if keep.batches is not None:
            bounds.append(rows.last_seq(conn, pipeline_id) - keep.batches + 1)
        if keep.since is not None:
            # The oldest batch planned since then, found from the floor up (a short walk in steady state).
            recent = conn.execute(
                sa.select(batches.c.batch_seq)
                .where(key, batches.c.batch_seq > floor.batch_seq, batches.c.created_at >= keep.since)
                .order_by(batches.c.batch_seq).limit(1)).scalar()
            if recent is not None:
                bounds.append(recent)
        return max(floor.batch_seq, min(bounds) - 1)

    def _prune(self, conn: Connection, pipeline_id: str, floor: Floor, through: int) -> Pruned:
        positions = rows.positions(conn, pipeline_id, through=through)
        interval_end = conn.execute(sa.select(sa.func.max(batch_intervals.c.interval_end))
                                    .where(*self._range(batch_intervals, pipeline_id, floor, through))).scalar()
        if floor.interval_end is not None:
            interval_end = max(floor.interval_end, interval_end or floor.interval_end)
        pruned = Pruned(through=through, transactions=1)
        created_at = conn.execute(sa.select(batches.c.created_at).where(
            batches.c.pipeline_id == pipeline_id, batches.c.batch_seq == through)).scalar()
        pruned.events = sum(conn.execute(events.delete().where(*where)).rowcount
                            for where in self._events_gone(conn, pipeline_id, through))
        pruned.offset_rows = conn.execute(batch_offsets.delete()
                                          .where(*self._range(batch_offsets, pipeline_id, floor, through))).rowcount
        conn.execute(batch_intervals.delete().where(*self._range(batch_intervals, pipeline_id, floor, through)))
        pruned.batches = conn.execute(batches.delete().where(*self._range(batches, pipeline_id, floor, through))
                                      ).rowcount
        # Resets recorded before the last pruned batch are folded into the floor.
        pruned.resets = conn.execute(position_resets.delete().where(
            position_resets.c.pipeline_id == pipeline_id, position_resets.c.after_batch_seq < through)).rowcount
        conn.execute(partition_floors.delete().where(partition_floors.c.pipeline_id == pipeline_id))
        if positions:
            conn.execute(partition_floors.insert(), [
                {"pipeline_id": pipeline_id, "topic": topic, "partition": partition, "floor_offset": offset}
                for (topic, partition), offset in sorted(positions.items())])
        values = {"batch_seq": through, "interval_end": interval_end,
                  "pruned_batches": floor.pruned_batches + pruned.batches, "pruned_at": utc_now(),
                  "batch_created_at": created_at or floor.batch_created_at}
        if floor.batch_seq == 0 and not conn.execute(sa.select(prune_floors.c.pipeline_id)
                                                     .where(prune_floors.c.pipeline_id == pipeline_id)).first():
            conn.execute(prune_floors.insert().values(pipeline_id=pipeline_id, **values))
        else:
            conn.execute(prune_floors.update().where(prune_floors.c.pipeline_id == pipeline_id).values(**values))
        return pruned

    @staticmethod
    def _range(table: sa.Table, pipeline_id: str, floor: Floor, through: int) -> tuple:
        """The rows of `table` that belong to batches floor + 1 .. through."""
        return (table.c.pipeline_id == pipeline_id, table.c.batch_seq > floor.batch_seq,
                table.c.batch_seq <= through)

    @staticmethod
    def _events_gone(conn: Connection, pipeline_id: str, through: int) -> list[tuple]:
        """Events of pruned batches; events of no batch recorded before the first batch that stays. Two conditions,
        each an index range of (pipeline_id, batch_seq), rather than one OR that would read every event."""
        kept_since = conn.execute(sa.select(batches.c.created_at)
                                  .where(batches.c.pipeline_id == pipeline_id, batches.c.batch_seq > through)
                                  .order_by(batches.c.batch_seq).limit(1)).scalar()
        gone: list[tuple] = [(events.c.pipeline_id == pipeline_id, events.c.batch_seq <= through)]
        if kept_since is not None:
            gone.append((events.c.pipeline_id == pipeline_id, events.c.batch_seq.is_(None), events.c.at < kept_since))
        return gone

    @staticmethod
    def _count(conn: Connection, table: sa.Table, where: tuple) -> int:
        return conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar() or 0
