"""The offset ledger: the only source of truth for what has been committed.

Plain SQLAlchemy Core, so the same code runs on the embedded SQLite file and on
PostgreSQL. Every state change is one SQL transaction guarded by the state it expects
(and, for a writer, the epoch it holds), so a stale writer is fenced by the database
rather than by timing.

One module per concern: `schema` (the tables), `engine` (connections), `rows` (the SQL every concern
shares inside its transactions, as functions of a connection: loading a batch, the positions, the epoch
fence), `base` (the engine and the helpers that need the ledger object, the compare-and-set among them),
then `pipeline`, `position`, `batch`, `interval`, `event` and `retention`, each a subclass of
`base.LedgerBase`; `Ledger` combines them.
"""

from __future__ import annotations

from airflow_exactly_once.core.ledger.batch import RELEASE_PENDING, BatchLedger, OpenWork
from airflow_exactly_once.core.ledger.engine import create_ledger_engine, missing_sqlite_file, redacted_url
from airflow_exactly_once.core.ledger.event import EventLedger
from airflow_exactly_once.core.ledger.interval import IntervalLedger
from airflow_exactly_once.core.ledger.pipeline import PipelineLedger
from airflow_exactly_once.core.ledger.position import PositionLedger
from airflow_exactly_once.core.ledger.retention import Keep, Pruned, RetentionLedger
from airflow_exactly_once.core.ledger.rows import Floor
from airflow_exactly_once.core.ledger.schema import (
    Boundary,
    Reset,
    TopicPartition,
    batch_intervals,
    batch_offsets,
    batches,
    boundaries,
    events,
    metadata,
    partition_floors,
    partitions,
    pipeline_dags,
    pipelines,
    position_resets,
    prune_floors,
)

__all__ = [
    "RELEASE_PENDING", "Boundary", "Floor", "Keep", "Ledger", "OpenWork", "Pruned", "Reset", "TopicPartition",
    "batch_intervals", "batch_offsets", "batches", "boundaries", "create_ledger_engine", "events", "metadata",
    "missing_sqlite_file", "partition_floors", "partitions", "pipeline_dags", "pipelines", "position_resets", "prune_floors",
    "redacted_url",
]


class Ledger(PipelineLedger, PositionLedger, BatchLedger, IntervalLedger, EventLedger, RetentionLedger):
    """The ledger: one object over one engine, with the methods of every concern (see the modules of this package)."""
