"""Interval mode: the data interval each batch reads, and the offsets fixed for points in time (boundaries)."""

from __future__ import annotations

import sqlalchemy as sa

from airflow_exactly_once.core.errors import FencedError
from airflow_exactly_once.core.ledger import rows
from airflow_exactly_once.core.ledger.base import LedgerBase
from airflow_exactly_once.core.ledger.rows import utc_now
from airflow_exactly_once.core.ledger.schema import Boundary, batch_intervals, batches, boundaries
from airflow_exactly_once.core.model import Batch, BatchId


class IntervalLedger(LedgerBase):
    """Batch intervals and interval boundaries."""

    def batch_interval(self, batch_id: BatchId) -> tuple[int, int] | None:
        with self._reading() as conn:
            row = conn.execute(sa.select(batch_intervals.c.interval_start, batch_intervals.c.interval_end)
                               .where(batch_intervals.c.pipeline_id == batch_id.pipeline_id,
                                      batch_intervals.c.batch_seq == batch_id.seq)).first()
        return None if row is None else (row[0], row[1])

    def batch_intervals(self, pipeline_id: str, seqs: list[int]) -> dict[int, tuple[int, int]]:
        """{batch number: its data interval} of those of `seqs` planned by interval, in one query."""
        if not seqs:
            return {}
        with self._reading() as conn:
            found = conn.execute(sa.select(batch_intervals.c.batch_seq, batch_intervals.c.interval_start,
                                          batch_intervals.c.interval_end)
                                .where(batch_intervals.c.pipeline_id == pipeline_id,
                                       batch_intervals.c.batch_seq.in_(seqs)))
            return {r[0]: (r[1], r[2]) for r in found}

    def interval_batches(self, pipeline_id: str, interval: tuple[int, int] | None = None) -> list[Batch]:
        """Batches tied to `interval` (or to any interval), newest first."""
        query = sa.select(batch_intervals.c.batch_seq).where(batch_intervals.c.pipeline_id == pipeline_id)
        if interval is not None:
            query = query.where(batch_intervals.c.interval_start == interval[0],
                                batch_intervals.c.interval_end == interval[1])
        with self._reading() as conn:
            seqs = sorted((r[0] for r in conn.execute(query)), reverse=True)
            return rows.load_many(conn, pipeline_id, seqs)

    def count_batches(self, pipeline_id: str, *, with_interval: bool) -> int:
        """How many batches were planned by interval (True) or by continuation (False)."""
        tied = sa.select(batch_intervals.c.batch_seq).where(batch_intervals.c.pipeline_id == pipeline_id)
        query = sa.select(sa.func.count()).select_from(batches).where(
            batches.c.pipeline_id == pipeline_id,
            batches.c.batch_seq.in_(tied) if with_interval else batches.c.batch_seq.not_in(tied))
        with self._reading() as conn:
            return conn.execute(query).scalar() or 0

    def newest_batch_mode(self, pipeline_id: str) -> str | None:
        """"interval" or "continuation": how the newest batch was planned (None before the first).

        Planning refuses to switch modes, so the newest batch speaks for all of them: one statement of two index
        lookups, where counting the batches of the other mode would read all of them.
        """
        newest = (sa.select(batches.c.batch_seq, batch_intervals.c.batch_seq.label("tied"))
                  .select_from(batches.outerjoin(batch_intervals, sa.and_(
                      batch_intervals.c.pipeline_id == batches.c.pipeline_id,
                      batch_intervals.c.batch_seq == batches.c.batch_seq)))
                  .where(batches.c.pipeline_id == pipeline_id)
                  .order_by(batches.c.batch_seq.desc()).limit(1))
        with self._reading() as conn:
            row = conn.execute(newest).first()
        if row is None:
            return None
        return "interval" if row.tied is not None else "continuation"

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
                        boundary_offset=recorded, origin=origin[:200], created_at=utc_now()))
                result[((topic, partition), at)] = recorded
        return result

    def list_boundaries(self, pipeline_id: str) -> dict[Boundary, int]:
        with self._reading() as conn:
            found = conn.execute(sa.select(boundaries).where(boundaries.c.pipeline_id == pipeline_id))
            return {((r.topic, r.partition), r.at_ms): r.boundary_offset for r in found}
