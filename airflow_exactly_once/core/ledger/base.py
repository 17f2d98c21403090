"""What every concern of the ledger shares: the engine, and the helpers that run inside a transaction.

The compare-and-set of a batch's state (`_set_state`), the epoch fence (`_bump_epoch`), loading a
batch and recording an event are used by several concerns, so they live here, once.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Iterable, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from airflow_exactly_once.core.errors import FencedError, IllegalTransitionError
from airflow_exactly_once.core.ledger.engine import create_ledger_engine
from airflow_exactly_once.core.ledger.schema import (
    Reset,
    TopicPartition,
    batch_offsets,
    batches,
    create_tables,
    events,
    pipelines,
    position_resets,
)
from airflow_exactly_once.core.model import Batch, BatchId, OffsetRange
from airflow_exactly_once.core.secrets import scrub
from airflow_exactly_once.core.states import BatchState, check_transition

_L = TypeVar("_L", bound="LedgerBase")


def utc_now() -> datetime:
    """The time every ledger row records (aware, UTC)."""
    return datetime.now(timezone.utc)


class LedgerBase:
    """The engine of a ledger; each concern adds its methods in a subclass, `Ledger` combines them."""

    def __init__(self, engine: Engine | str) -> None:
        self.engine = create_ledger_engine(engine) if isinstance(engine, str) else engine
        # Secret values that no error, event or detail written through this ledger may hold (see hide()).
        self.hidden: frozenset[str] = frozenset()

    def hide(self, secrets: Iterable[str]) -> None:
        """Keep these values (a pipeline's secrets) out of every text this ledger writes; a URL's password
        is always kept out."""
        self.hidden = self.hidden | frozenset(secrets)

    def scrubbed(self, text: str) -> str:
        """`text` as the ledger may keep it: without the hidden values or any URL's password."""
        return scrub(text, self.hidden)

    @property
    def url(self) -> str:
        """The SQLAlchemy URL, password included: for the write job's own connections (spark-submit, claim checks)."""
        return self.engine.url.render_as_string(hide_password=False)

    @classmethod
    def read_only(cls: type[_L], url: str) -> _L:
        """A ledger that can only be read (create_ledger_engine's `read_only`); its schema is never created."""
        return cls(create_ledger_engine(url, read_only=True))

    def has_schema(self) -> bool:
        """Whether the ledger's tables exist (a reader must not create them)."""
        return sa.inspect(self.engine).has_table(pipelines.name)

    def create_schema(self) -> None:
        with self.engine.begin() as conn:  # one transaction: on SQLite it holds the write lock
            create_tables(conn)

    def _event(self, conn: Connection, pipeline_id: str, batch_seq: int | None, kind: str, message: str) -> None:
        conn.execute(events.insert().values(pipeline_id=pipeline_id, batch_seq=batch_seq, kind=kind,
                                            message=self.scrubbed(message), at=utc_now()))

    def _insert_resets(self, conn: Connection, pipeline_id: str, resets: dict[TopicPartition, Reset],
                       after_seq: int, kind: str) -> None:
        for (topic, partition), (offset, reason) in sorted(resets.items()):
            conn.execute(position_resets.insert().values(
                pipeline_id=pipeline_id, topic=topic, partition=partition, new_offset=offset,
                after_batch_seq=after_seq, kind=kind, reason=self.scrubbed(reason)[:4000], at=utc_now()))
            self._event(conn, pipeline_id, None, kind, f"{topic}[{partition}] continues at offset {offset}: {reason}")

    @staticmethod
    def _bump_epoch(conn: Connection, pipeline_id: str, expected_epoch: int) -> int:
        result = conn.execute(pipelines.update()
                              .where(pipelines.c.pipeline_id == pipeline_id, pipelines.c.epoch == expected_epoch)
                              .values(epoch=expected_epoch + 1, updated_at=utc_now()))
        if result.rowcount != 1:
            raise FencedError(f"pipeline {pipeline_id} was taken over concurrently (epoch is no longer "
                              f"{expected_epoch}); planning again", retriable=True)
        return expected_epoch + 1

    def _set_state(self, conn: Connection, batch_id: BatchId, expected: BatchState, target: BatchState,
                   epoch: int | None = None, **values: Any) -> None:
        check_transition(expected, target)
        if values.get("error"):
            values["error"] = self.scrubbed(values["error"])
        where = [batches.c.pipeline_id == batch_id.pipeline_id, batches.c.batch_seq == batch_id.seq,
                 batches.c.state == expected.value]
        if epoch is not None:
            where.append(batches.c.epoch == epoch)
        result = conn.execute(batches.update().where(*where).values(state=target.value, updated_at=utc_now(), **values))
        if result.rowcount == 1:
            return
        current = self._require(conn, batch_id)
        if epoch is not None and current.epoch != epoch:
            raise FencedError(f"batch {batch_id} is held by epoch {current.epoch}, this writer holds {epoch}: "
                              "a newer attempt or run took it over")
        raise FencedError(f"batch {batch_id} is {current.state.value}, expected {expected.value}: "
                          "another run or attempt changed it")

    @staticmethod
    def _last_seq(conn: Connection, pipeline_id: str) -> int:
        """The newest batch number of the pipeline (0 before its first batch)."""
        return conn.execute(sa.select(sa.func.max(batches.c.batch_seq))
                            .where(batches.c.pipeline_id == pipeline_id)).scalar() or 0

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
