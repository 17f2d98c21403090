"""Positions: where each partition started, where the next batch starts, and moving it on purpose (rewind)."""

from __future__ import annotations

from typing import Any, Iterable

import sqlalchemy as sa

from airflow_exactly_once.core.errors import FencedError
from airflow_exactly_once.core.ledger import rows
from airflow_exactly_once.core.ledger.base import LedgerBase
from airflow_exactly_once.core.ledger.rows import Floor, utc_now
from airflow_exactly_once.core.ledger.schema import (
    Reset,
    TopicPartition,
    batches,
    partitions,
    position_resets,
)
from airflow_exactly_once.core.model import BatchId, dumps
from airflow_exactly_once.core.states import BatchState


class PositionLedger(LedgerBase):
    """Partition starts, committed positions, position resets and rewinds."""

    def initial_offsets(self, pipeline_id: str) -> dict[TopicPartition, int]:
        with self._reading() as conn:
            found = conn.execute(sa.select(partitions).where(partitions.c.pipeline_id == pipeline_id))
            return {(r.topic, r.partition): r.initial_offset for r in found}

    def partition_starts(self, pipeline_id: str) -> dict[TopicPartition, tuple[int, str]]:
        """Where each partition started and why (a startup mode, a new partition, a topic a topic_pattern found)."""
        with self._reading() as conn:
            found = conn.execute(sa.select(partitions).where(partitions.c.pipeline_id == pipeline_id))
            return {(r.topic, r.partition): (r.initial_offset, r.origin) for r in found}

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
            new = [(tp, start) for tp, start in sorted(starts.items()) if tp not in known]
            if not new:
                return
            now = utc_now()  # one statement each for the rows and their events: a topic may have 1,000 partitions
            conn.execute(partitions.insert(), [dict(pipeline_id=pipeline_id, topic=topic, partition=partition,
                                                    initial_offset=offset, origin=origin, created_at=now)
                                               for (topic, partition), (offset, origin) in new])
            self._events(conn, pipeline_id, "partition-added",
                         [(None, f"{topic}[{partition}] starts at offset {offset} ({origin})")
                          for (topic, partition), (offset, origin) in new])

    def committed_positions(self, pipeline_id: str) -> dict[TopicPartition, int]:
        """Per partition: where the next batch starts (see rows.positions)."""
        with self._reading() as conn:
            return rows.positions(conn, pipeline_id)

    def retention_floor(self, pipeline_id: str) -> Floor:
        """What retention has pruned of the pipeline (core.retention); batch 0 when nothing."""
        with self._reading() as conn:
            return rows.floor(conn, pipeline_id)

    def position_resets(self, pipeline_id: str) -> list[dict[str, Any]]:
        """Recorded position resets, oldest first."""
        query = (sa.select(position_resets).where(position_resets.c.pipeline_id == pipeline_id)
                 .order_by(position_resets.c.reset_id))
        with self._reading() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]

    # -- rewinds (the retractions they leave are BatchLedger.open_work's) --------------

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
            epoch = rows.bump_epoch(conn, pipeline_id, expected_epoch)
            last = rows.last_seq(conn, pipeline_id)
            for seq in retract:
                old = rows.require(conn, BatchId(pipeline_id, seq))
                self._set_state(conn, old.id, BatchState.COMMITTED, BatchState.RETRACTED, error=f"rewound: {reason}",
                                details=dumps({**old.details, "output_retracted": False}))
            self._insert_resets(conn, pipeline_id, resets, last, "rewind")
            retracted = ", ".join(str(seq) for seq in retract) or "none"
            self._event(conn, pipeline_id, None, "rewind", f"{reason}; batches retracted: {retracted}")
            return epoch
