"""The PostgreSQL sink's writer: one prepared transaction per Spark partition.

Every Spark partition writes its rows and a marker row in one transaction and ends it with
`PREPARE TRANSACTION <gid>` (durable, invisible; sinks.postgres.writer); the driver stores the
gids as the batch's handles, and the committer (sinks.postgres.sink_committer) commits them.
"""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.core.errors import SinkError
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import RunWriters
from airflow_exactly_once.core.sink_writer import SinkWriter
from airflow_exactly_once.sinks.postgres.attempts import PreparedAttempts
from airflow_exactly_once.sinks.postgres.committable import PostgresCommittable
from airflow_exactly_once.sinks.postgres.errors import PostgresTransactionError
from airflow_exactly_once.sinks.postgres.markers import ensure_marker_table
from airflow_exactly_once.sinks.postgres.spec import PostgresSpec
from airflow_exactly_once.sinks.postgres.table import PostgresTable, with_lock_timeout
from airflow_exactly_once.sinks.postgres.writer import PostgresPartitionWriter


class PostgresSinkWriter(SinkWriter):
    spec_type = PostgresSpec

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.table = PostgresTable(spec)

    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> PostgresCommittable:
        """Prepare one transaction per non-empty Spark partition; roll them all back on failure."""
        table, attempts = self.table, PreparedAttempts(self.table, self.pipeline)
        epoch = batch.epoch  # the write attempt: its gids carry it
        try:
            attempts.rollback_dead(batch, keep_epoch=epoch)
            ensure_marker_table(table.dsn, table.marker_schema)
            table.create_if_missing()
            columns = table.writable_columns(list(frame.columns))
            keys = table.upsert_key()
            slots = table.free_slots()
        except PostgresTransactionError as exc:
            raise SinkError(f"postgres sink: {exc}", retriable=exc.retriable) from exc
        if table.mode == "upsert":
            # Rows of one key must meet in one transaction: across two prepared transactions the
            # second would wait for the first's row lock until commit, which never comes.
            frame = frame.repartition(table.writers, *keys) if table.writers else frame.repartition(*keys)
        elif table.writers:
            frame = frame.repartition(table.writers)
        frame = frame.coalesce(slots)  # never more transactions than free prepared slots (keys stay together)
        if table.order_by:
            frame = frame.sortWithinPartitions(*table.order_by)  # upsert: the last row of a key wins
        writer = PostgresPartitionWriter(
            dsn=with_lock_timeout(table.dsn, table.lock_timeout_ms), pipeline_id=attempts.owner(batch),
            batch_seq=batch.seq, attempt=epoch, table=table.table, columns=tuple(columns), mode=table.mode,
            key_columns=keys, marker_schema=table.marker_schema, page_size=table.page_size)
        try:
            parts = run_writers(frame, writer)  # columns: frame.columns, in order
        except Exception:
            attempts.rollback_attempt(batch, epoch)
            raise
        return PostgresCommittable.of(table.table, table.mode, epoch, parts)
