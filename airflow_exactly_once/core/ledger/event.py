"""Events: the audit trail of decisions (skipped data, replays, rewinds, aborts), newest first."""

from __future__ import annotations

from typing import Any, Iterable

import sqlalchemy as sa

from airflow_exactly_once.core.ledger.base import LedgerBase
from airflow_exactly_once.core.ledger.schema import events


class EventLedger(LedgerBase):
    """Recording and listing events (the other concerns record theirs in their own transactions)."""

    def record_event(self, pipeline_id: str, batch_seq: int | None, kind: str, message: str) -> None:
        with self.engine.begin() as conn:
            self._event(conn, pipeline_id, batch_seq, kind, message)

    def list_events(self, pipeline_id: str, limit: int = 100,
                    kinds: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """The newest `limit` events (of `kinds` only, when given), newest first."""
        query = sa.select(events).where(events.c.pipeline_id == pipeline_id)
        if kinds is not None:
            query = query.where(events.c.kind.in_(list(kinds)))
        query = query.order_by(events.c.event_id.desc()).limit(limit)
        with self._reading() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]
