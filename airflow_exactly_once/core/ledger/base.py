"""What every concern of the ledger shares that needs the ledger object: the engine, and the helpers that scrub.

The compare-and-set of a batch's state (`_set_state`) and recording an event or a position reset are used by
several concerns and scrub the secrets the ledger hides from what they write, so they live here, once. The SQL
the concerns share that needs only a connection (loading a batch, the positions, the epoch fence `bump_epoch`)
is `rows`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Iterable, TypeVar

from sqlalchemy.engine import Connection, Engine

from airflow_exactly_once.core.errors import FencedError
from airflow_exactly_once.core.ledger import rows, versioning
from airflow_exactly_once.core.ledger.engine import create_ledger_engine, read_connection
from airflow_exactly_once.core.ledger.rows import utc_now
from airflow_exactly_once.core.ledger.schema import Reset, TopicPartition, batches, events, position_resets
from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.secrets import scrub
from airflow_exactly_once.core.states import BatchState, check_transition

_L = TypeVar("_L", bound="LedgerBase")


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
        """For readers, which never create or migrate it: whether the ledger's tables exist.

        A ledger at an older or newer schema version than this code raises LedgerVersionError.
        """
        return versioning.check_readable(self.engine)

    def create_schema(self) -> None:
        """For writers: create the schema, or upgrade it to this code's version (versioning.ensure_current).

        Only the first call per engine reads the version; $AIRFLOW_EXACTLY_ONCE_LEDGER_AUTO_UPGRADE=false
        turns the upgrade into an error that asks for `airflow-exactly-once db upgrade`.
        """
        versioning.ensure_current(self.engine)

    def upgrade_schema(self) -> tuple[versioning.SchemaVersion, versioning.SchemaVersion]:
        """Upgrade the schema to this code's version now (`db upgrade`), whatever the automatic setting."""
        return versioning.upgrade(self.engine)

    def schema_version(self) -> versioning.SchemaVersion:
        """Where the schema stands (read only)."""
        with self._reading() as conn:
            return versioning.schema_version(conn)

    def _reading(self) -> AbstractContextManager[Connection]:
        """A connection for reads only (engine.read_connection: no transaction on PostgreSQL at READ COMMITTED)."""
        return read_connection(self.engine)

    def _event(self, conn: Connection, pipeline_id: str, batch_seq: int | None, kind: str, message: str) -> None:
        self._events(conn, pipeline_id, kind, [(batch_seq, message)])

    def _events(self, conn: Connection, pipeline_id: str, kind: str,
                messages: list[tuple[int | None, str]]) -> None:
        """Events of one kind, in this order, in one statement (one per partition of a 1,000-partition topic
        would be as many round trips)."""
        if not messages:
            return
        at = utc_now()
        conn.execute(events.insert(), [dict(pipeline_id=pipeline_id, batch_seq=batch_seq, kind=kind,
                                            message=self.scrubbed(message), at=at) for batch_seq, message in messages])

    def _insert_resets(self, conn: Connection, pipeline_id: str, resets: dict[TopicPartition, Reset],
                       after_seq: int, kind: str) -> None:
        """Position resets and their events, each in one statement however many partitions they move."""
        if not resets:
            return
        at = utc_now()
        ordered = sorted(resets.items())
        conn.execute(position_resets.insert(), [dict(
            pipeline_id=pipeline_id, topic=topic, partition=partition, new_offset=offset, after_batch_seq=after_seq,
            kind=kind, reason=self.scrubbed(reason)[:4000], at=at) for (topic, partition), (offset, reason) in ordered])
        self._events(conn, pipeline_id, kind, [(None, f"{topic}[{partition}] continues at offset {offset}: {reason}")
                                               for (topic, partition), (offset, reason) in ordered])

    def _set_state(self, conn: Connection, batch_id: BatchId, expected: BatchState, target: BatchState,
                   epoch: int | None = None, **values: Any) -> Any:
        """The compare-and-set of a batch's state (and the writer's epoch); returns the row as written where the
        database returns it (rows.write_row), else None."""
        check_transition(expected, target)
        if values.get("error"):
            values["error"] = self.scrubbed(values["error"])
        where = [batches.c.pipeline_id == batch_id.pipeline_id, batches.c.batch_seq == batch_id.seq,
                 batches.c.state == expected.value]
        if epoch is not None:
            where.append(batches.c.epoch == epoch)
        count, row = rows.write_row(conn, batches.update().where(*where)
                                    .values(state=target.value, updated_at=utc_now(), **values))
        if count == 1:
            return row
        current = rows.require(conn, batch_id)
        if epoch is not None and current.epoch != epoch:
            raise FencedError(f"batch {batch_id} is held by epoch {current.epoch}, this writer holds {epoch}: "
                              "a newer attempt or run took it over")
        raise FencedError(f"batch {batch_id} is {current.state.value}, expected {expected.value}: "
                          "another run or attempt changed it")
