"""The PostgreSQL sink's partition writer: one Spark partition, one prepared transaction, on an executor.

It turns Arrow batches into rows, writes them and a marker row in one transaction and ends
it with `PREPARE TRANSACTION <gid>`; the GID is the partition's commit message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from airflow_exactly_once.core.claim import ClaimCheck
from airflow_exactly_once.core.sink import PartitionWriter
from airflow_exactly_once.sinks.postgres.committable import PreparedPartition
from airflow_exactly_once.sinks.postgres.errors import PostgresTransactionError
from airflow_exactly_once.sinks.postgres.gids import make_gid
from airflow_exactly_once.sinks.postgres.prepare import prepare_rows


def _copyable(arrow_type) -> bool:
    """Types whose Arrow CSV text PostgreSQL reads back as the same value."""
    import pyarrow as pa

    return any(check(arrow_type) for check in (
        pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_string,
        pa.types.is_large_string, pa.types.is_decimal, pa.types.is_date, pa.types.is_timestamp))


def _as_csv(batches: list) -> tuple[Any, int]:
    """The batches as PostgreSQL CSV (strings quoted, NULL an unquoted empty field), and the row count."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    sink = pa.BufferOutputStream()
    options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
    with pacsv.CSVWriter(sink, batches[0].schema, write_options=options) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return pa.BufferReader(sink.getvalue()), sum(b.num_rows for b in batches)


def _column_values(column) -> list[Any]:
    """Python values psycopg2 can adapt; structs and maps go to json/jsonb columns."""
    import pyarrow as pa
    from psycopg2.extras import Json

    values = column.to_pylist()
    if pa.types.is_struct(column.type):
        return [None if v is None else Json(v) for v in values]
    if pa.types.is_map(column.type):
        return [None if v is None else Json(dict(v)) for v in values]
    return values


@dataclass(frozen=True)
class PostgresPartitionWriter(PartitionWriter):
    """Everything a partition needs, pickled to the executors (the DSN may hold a password)."""

    dsn: str
    pipeline_id: str
    batch_seq: int
    attempt: int
    table: str
    columns: tuple[str, ...]
    mode: str
    key_columns: tuple[str, ...]
    marker_schema: str
    page_size: int

    def write(self, partition: int, batches: Iterator[Any],
              claim: ClaimCheck | None = None) -> PreparedPartition | None:
        # [START claim_check]
        arrow = [b for b in batches if b.num_rows]
        if not arrow:
            return None  # an empty partition holds no prepared transaction
        if claim is not None:  # an aborted batch's zombie must not leave a prepared transaction holding locks
            claim.ensure(f"writing Spark partition {partition} into {self.table}")
        # [END claim_check]
        gid = make_gid(self.pipeline_id, self.batch_seq, partition, self.attempt)
        marker = {"pipeline_id": self.pipeline_id, "batch_seq": self.batch_seq, "partition_id": partition}
        rows: list[tuple] = []
        csv = None
        if self.mode == "insert" and all(_copyable(f.type) for f in arrow[0].schema):
            csv, marker["row_count"] = _as_csv(arrow)  # COPY: several times faster than INSERTs
        else:
            for batch in arrow:
                rows.extend(zip(*(_column_values(c) for c in batch.columns)))
        try:
            handle = prepare_rows(self.dsn, gid, self.table, self.columns, rows, marker, self.mode,
                                  self.key_columns or None, marker_schema=self.marker_schema,
                                  page_size=self.page_size, copy_csv=csv)
        except PostgresTransactionError as exc:
            raise PostgresTransactionError(f"Spark partition {partition}: {exc}", retriable=exc.retriable) from None
        return PreparedPartition(gid, partition, handle["rows_written"])
