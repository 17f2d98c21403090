"""A long ledger history, bulk-loaded: the fixture of the retention crash test and of benchmarks/bench_ledger_scale.py.

Writing a million batches through the protocol would take hours; what a long-running pipeline
leaves behind is plain rows, so they are loaded directly (SQLite: executemany on one
connection; PostgreSQL: COPY), as the ledger's own code would have written them: COMMITTED
batches that tile every partition from offset 0, their offset ranges, and an event every
`event_every` batches. The pipeline and its partitions are recorded through the ledger.
"""

from __future__ import annotations

import csv
import io
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow_exactly_once.core.ledger import Ledger

CHUNK = 20_000  # batches per bulk statement
COLUMNS = {
    "aeo_batch": ("pipeline_id", "batch_seq", "run_id", "state", "epoch", "handles", "input_records",
                  "output_records", "error", "details", "created_at", "updated_at"),
    "aeo_batch_offset": ("pipeline_id", "batch_seq", "topic", "partition", "start_offset", "end_offset"),
    "aeo_event": ("pipeline_id", "batch_seq", "kind", "message", "at"),
}


def load_history(ledger: Ledger, pipeline_id: str, config: dict[str, Any], *, batches: int, partitions: int,
                 fingerprint: str = "history", topic: str = "t", records: int = 100, event_every: int = 10,
                 oldest: datetime | None = None, spacing: timedelta = timedelta(minutes=1)
                 ) -> dict[tuple[str, int], int]:
    """Record `batches` COMMITTED batches of `records` offsets per partition, planned `spacing` apart from
    `oldest` (default: so that the newest is an hour old); returns the committed positions they leave."""
    ledger.create_schema()
    ledger.ensure_pipeline(pipeline_id, fingerprint, config)
    tps = [(topic, p) for p in range(partitions)]
    ledger.register_partitions(pipeline_id, {tp: (0, "startup mode earliest") for tp in tps})
    oldest = oldest or datetime.now(timezone.utc) - timedelta(hours=1) - spacing * batches
    first = ledger.last_batch_seq(pipeline_id) + 1
    with ledger.engine.begin() as conn:
        raw = conn.connection.dbapi_connection
        for start in range(first, first + batches, CHUNK):
            seqs = range(start, min(first + batches, start + CHUNK))
            rows = _rows(pipeline_id, seqs, first, tps, records, event_every, oldest, spacing)
            for table, table_rows in rows.items():
                _write(raw, ledger.engine.dialect.name, table, table_rows)
    if ledger.engine.dialect.name == "postgresql":  # statistics, as autovacuum keeps them on a long-lived ledger
        with ledger.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE " + ", ".join(COLUMNS))
    end = (first - 1 + batches) * records
    return {tp: end for tp in tps}


def _rows(pipeline_id: str, seqs: range, first: int, tps: list[tuple[str, int]], records: int, event_every: int,
          oldest: datetime, spacing: timedelta) -> dict[str, list[tuple]]:
    found: dict[str, list[tuple]] = {table: [] for table in COLUMNS}
    for seq in seqs:
        at = oldest + spacing * (seq - first)
        n = len(tps) * records
        found["aeo_batch"].append((pipeline_id, seq, f"scheduled__{seq}", "COMMITTED", seq, '{"records":%d}' % n, n, n,
                                   None, "{}", at, at + timedelta(seconds=20)))
        for topic, partition in tps:
            found["aeo_batch_offset"].append((pipeline_id, seq, topic, partition, (seq - 1) * records, seq * records))
        if event_every and seq % event_every == 0:
            found["aeo_event"].append((pipeline_id, seq, "recovered", f"batch {seq} was committed by recovery", at))
    return found


def _write(raw: Any, dialect: str, table: str, rows: list[tuple]) -> None:
    columns = COLUMNS[table]
    cursor = raw.cursor()
    try:
        if dialect == "postgresql":  # COPY: the bulk path of PostgreSQL
            cursor.copy_expert(f"COPY {table} ({', '.join(columns)}) FROM STDIN WITH (FORMAT csv)", _csv(rows))
        else:  # timestamps as SQLAlchemy's SQLite DateTime stores them
            rows = [tuple(v.strftime("%Y-%m-%d %H:%M:%S.%f") if isinstance(v, datetime) else v for v in row)
                    for row in rows]
            cursor.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                               f"({', '.join('?' for _ in columns)})", rows)
    finally:
        cursor.close()


def _csv(rows: list[tuple]) -> io.StringIO:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    for row in rows:
        writer.writerow("" if v is None else v.isoformat() if isinstance(v, datetime) else v for v in row)
    buffer.seek(0)
    return buffer

