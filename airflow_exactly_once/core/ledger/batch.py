"""Batches: their offset ranges and their state transitions, each one a compare-and-set in one transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import sqlalchemy as sa

from airflow_exactly_once.core.errors import FencedError
from airflow_exactly_once.core.ledger import rows
from airflow_exactly_once.core.ledger.base import LedgerBase
from airflow_exactly_once.core.ledger.rows import utc_now
from airflow_exactly_once.core.ledger.schema import (
    Reset,
    TopicPartition,
    batch_intervals,
    batch_offsets,
    batches,
    pipelines,
)
from airflow_exactly_once.core.model import Batch, BatchId, OffsetRange, dumps
from airflow_exactly_once.core.states import BatchState, check_initial

# A batch detail: the batch is ABORTED but what it staged is still to be taken away (BatchCoordinator.release);
# None once it was.
RELEASE_PENDING = "release_pending"
# A batch detail: False while a RETRACTED batch's output is still to be withdrawn from the sink.
OUTPUT_RETRACTED = "output_retracted"


@dataclass(frozen=True)
class OpenWork:
    """What a plan's recovery finishes and what is in flight, as one read found them (BatchLedger.open_work)."""

    retractions: list[Batch]  # RETRACTED, output not yet withdrawn, oldest first
    releases: list[Batch]  # ABORTED, staged output not yet taken away (pending_releases), oldest first
    prepared: list[Batch]  # PREPARED, oldest first
    in_flight: list[Batch]  # PLANNED and PREPARED, newest first (list_batches' order)


class BatchLedger(LedgerBase):
    """Batches: reading them, creating them and moving them through their states."""

    def get_batch(self, batch_id: BatchId) -> Batch:
        with self._reading() as conn:
            return rows.require(conn, batch_id)

    def find_batch(self, batch_id: BatchId) -> Batch | None:
        """The batch, or None when the ledger has no such batch (never had it, or retention pruned it)."""
        with self._reading() as conn:
            return rows.load(conn, batch_id)

    def list_batches(self, pipeline_id: str, states: Iterable[BatchState] | None = None,
                     limit: int | None = None, newest_first: bool = True) -> list[Batch]:
        query = sa.select(batches.c.batch_seq).where(batches.c.pipeline_id == pipeline_id)
        if states is not None:
            query = query.where(batches.c.state.in_([s.value for s in states]))
        if limit is not None:  # the newest (or oldest) few: an index range in batch order
            query = query.order_by(batches.c.batch_seq.desc() if newest_first else batches.c.batch_seq.asc())
            query = query.limit(limit)
        with self._reading() as conn:
            # Without a limit, sorted here: an ORDER BY over several states would make the database walk
            # every batch in order rather than read each state's index range.
            seqs = sorted((r[0] for r in conn.execute(query)), reverse=newest_first)
            return rows.load_many(conn, pipeline_id, seqs)

    def latest_batch_for_run(self, pipeline_id: str, run_id: str) -> Batch | None:
        query = (sa.select(sa.func.max(batches.c.batch_seq))
                 .where(batches.c.pipeline_id == pipeline_id, batches.c.run_id == run_id))
        with self._reading() as conn:
            seq = conn.execute(query).scalar()
            return None if seq is None else rows.load(conn, BatchId(pipeline_id, seq))

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
            epoch = rows.bump_epoch(conn, pipeline_id, expected_epoch)
            for seq in supersede:
                old = rows.require(conn, BatchId(pipeline_id, seq))
                try:  # a superseded attempt may have staged output (or still run): recovery releases it
                    self._set_state(conn, old.id, BatchState.PLANNED, BatchState.ABORTED,
                                    error=f"superseded by run {run_id}",
                                    details=dumps({**old.details, RELEASE_PENDING: True}))
                except FencedError as exc:
                    # Its write finished (PREPARED) after this run looked: plan again, recovering it first.
                    raise FencedError(f"{exc}; planning again", retriable=True) from exc
                self._event(conn, pipeline_id, seq, "superseded",
                            f"batch {seq} was still PLANNED and was taken over by run {run_id}")
            now = utc_now()
            values = dict(pipeline_id=pipeline_id, run_id=run_id, state=state.value, epoch=epoch,
                          details=dumps(details or {}), created_at=now, updated_at=now)
            if conn.dialect.insert_returning:
                # The next number within the INSERT, which returns it: no batch of the pipeline can be recorded
                # in between either way, as this transaction holds the pipeline row it updated (the epoch).
                next_seq = (sa.select(sa.func.coalesce(sa.func.max(batches.c.batch_seq), 0) + 1)
                            .where(batches.c.pipeline_id == pipeline_id).scalar_subquery())
                _, created = rows.write_row(conn, batches.insert().values(batch_seq=next_seq, **values))
                seq = created.batch_seq
            else:
                seq, created = rows.last_seq(conn, pipeline_id) + 1, None
                conn.execute(batches.insert().values(batch_seq=seq, **values))
            if interval is not None:
                conn.execute(batch_intervals.insert().values(pipeline_id=pipeline_id, batch_seq=seq,
                                                             interval_start=interval[0], interval_end=interval[1]))
            self._insert_resets(conn, pipeline_id, resets or {}, seq - 1, "data-loss-skip")
            ranges = sorted(ranges)
            offset_rows = [dict(pipeline_id=pipeline_id, batch_seq=seq, topic=r.topic, partition=r.partition,
                                start_offset=r.start, end_offset=r.end) for r in ranges]
            if offset_rows:
                conn.execute(batch_offsets.insert(), offset_rows)
            if created is not None:
                return rows.batch_of(created, ranges)
            return rows.require(conn, BatchId(pipeline_id, seq))

    def claim(self, batch_id: BatchId) -> Batch:
        """A write attempt takes the batch over: a new epoch fences any older attempt."""
        with self.engine.begin() as conn:
            current = rows.require(conn, batch_id)
            if current.state is not BatchState.PLANNED:
                raise FencedError(f"batch {batch_id} is {current.state.value}, not PLANNED; "
                                  "another run or attempt has taken it over")
            pipeline_epoch = conn.execute(sa.select(pipelines.c.epoch)
                                          .where(pipelines.c.pipeline_id == batch_id.pipeline_id)).scalar_one()
            epoch = rows.bump_epoch(conn, batch_id.pipeline_id, pipeline_epoch)
            count, row = rows.write_row(conn, (
                batches.update()
                .where(batches.c.pipeline_id == batch_id.pipeline_id, batches.c.batch_seq == batch_id.seq,
                       batches.c.state == BatchState.PLANNED.value, batches.c.epoch == current.epoch)
                .values(epoch=epoch, updated_at=utc_now())))
            if count != 1:
                raise FencedError(f"batch {batch_id} changed while being claimed", retriable=True)
            return rows.batch_of(row, current.ranges) if row is not None else rows.require(conn, batch_id)

    def mark_prepared(self, batch_id: BatchId, epoch: int, handles: dict[str, Any],
                      input_records: int | None, output_records: int | None,
                      details: dict[str, Any] | None = None) -> Batch:
        """PLANNED -> PREPARED by the attempt holding `epoch`; `details` are merged into the batch's."""
        with self.engine.begin() as conn:
            values: dict[str, Any] = {"handles": dumps(handles), "input_records": input_records,
                                      "output_records": output_records}
            ranges = None
            if details:
                current = rows.require(conn, batch_id)
                values["details"] = dumps({**current.details, **details})
                ranges = current.ranges
            row = self._set_state(conn, batch_id, BatchState.PLANNED, BatchState.PREPARED, epoch=epoch, **values)
            if row is None:
                return rows.require(conn, batch_id)
            return rows.batch_of(row, rows.ranges_of(conn, batch_id) if ranges is None else ranges)

    def mark_committed(self, batch_id: BatchId, retracts: Iterable[int] = ()) -> bool:
        """PREPARED -> COMMITTED; False (no change) when it already is COMMITTED.

        Batches in `retracts` (whose output the sink has just replaced by this batch's)
        go COMMITTED -> RETRACTED in the same transaction.
        """
        with self.engine.begin() as conn:
            # The compare-and-set first: the batch is read only when it fails (already COMMITTED, or not PREPARED).
            try:
                self._set_state(conn, batch_id, BatchState.PREPARED, BatchState.COMMITTED)
            except FencedError:
                if rows.require(conn, batch_id).state is BatchState.COMMITTED:
                    return False
                raise
            for seq in retracts:
                old = rows.require(conn, BatchId(batch_id.pipeline_id, seq))
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
            current = rows.require(conn, batch_id)
            if current.state is BatchState.ABORTED:
                return False
            values: dict[str, Any] = {"error": reason[:4000]}
            if release_pending:
                values["details"] = dumps({**current.details, RELEASE_PENDING: True})
            self._set_state(conn, batch_id, from_state, BatchState.ABORTED, **values)
            self._event(conn, batch_id.pipeline_id, batch_id.seq, "aborted", reason[:4000])
            return True

    def open_work(self, pipeline_id: str) -> OpenWork:
        """The retractions still to finish, pending_releases and the batches in flight in one query (and one more
        to load them when there are any): what a plan reads before it decides, three reads before."""
        details = batches.c.details
        query = (sa.select(batches.c.batch_seq)
                 .where(batches.c.pipeline_id == pipeline_id,
                        batches.c.state.in_([BatchState.PLANNED.value, BatchState.PREPARED.value,
                                             BatchState.RETRACTED.value, BatchState.ABORTED.value]),
                        sa.or_(batches.c.state.in_([BatchState.PLANNED.value, BatchState.PREPARED.value]),
                               sa.and_(batches.c.state == BatchState.RETRACTED.value,
                                       details.contains(f'"{OUTPUT_RETRACTED}"')),
                               sa.and_(batches.c.state == BatchState.ABORTED.value,
                                       details.contains(f'"{RELEASE_PENDING}"')))))
        with self._reading() as conn:
            seqs = sorted(r[0] for r in conn.execute(query))
            found = rows.load_many(conn, pipeline_id, seqs)

        def having(state: BatchState) -> list[Batch]:
            return [b for b in found if b.state is state]

        return OpenWork(
            retractions=[b for b in having(BatchState.RETRACTED) if not b.details.get(OUTPUT_RETRACTED, True)],
            releases=[b for b in having(BatchState.ABORTED) if b.details.get(RELEASE_PENDING)],
            prepared=having(BatchState.PREPARED),
            in_flight=[b for b in reversed(found) if b.state in (BatchState.PLANNED, BatchState.PREPARED)])

    def pending_releases(self, pipeline_id: str) -> list[Batch]:
        """ABORTED batches whose staged output (transactions, folders, snapshots) was not yet taken away."""
        return self.open_work(pipeline_id).releases

    def update_details(self, batch_id: BatchId, **details: Any) -> None:
        with self.engine.begin() as conn:
            current = rows.require(conn, batch_id)
            merged = {**current.details, **details}
            conn.execute(batches.update()
                         .where(batches.c.pipeline_id == batch_id.pipeline_id, batches.c.batch_seq == batch_id.seq)
                         .values(details=self.scrubbed(dumps(merged)), updated_at=utc_now()))

    def run_ids(self, pipeline_id: str) -> set[str]:
        """Every Airflow run id that recorded a batch of the pipeline."""
        with self._reading() as conn:
            return {r[0] for r in conn.execute(sa.select(batches.c.run_id).distinct()
                                               .where(batches.c.pipeline_id == pipeline_id))}

    def state_counts(self, pipeline_id: str) -> dict[str, int]:
        """{state: how many batches of the pipeline are in it}."""
        query = (sa.select(batches.c.state, sa.func.count()).where(batches.c.pipeline_id == pipeline_id)
                 .group_by(batches.c.state))
        with self._reading() as conn:
            return {state: count for state, count in conn.execute(query)}

    def last_batch_seq(self, pipeline_id: str) -> int:
        """The newest batch number of the pipeline (0 before its first batch)."""
        with self._reading() as conn:
            return rows.last_seq(conn, pipeline_id)
