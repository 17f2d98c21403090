"""The ledger's SQL schema: the nine tables, in one place, and their creation.

Every concern of the ledger reads and writes these tables through SQLAlchemy Core, so the
same definitions serve the embedded SQLite file and PostgreSQL.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

metadata = sa.MetaData()

pipelines = sa.Table(
    "aeo_pipeline",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)

# Where each partition started: resolved once from the startup mode (or the policy for
# partitions added later) and then fixed, so "latest" means latest when first seen.
partitions = sa.Table(
    "aeo_partition",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("topic", sa.String(249), primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True),
    sa.Column("initial_offset", sa.BigInteger, nullable=False),
    sa.Column("origin", sa.String(200), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

batches = sa.Table(
    "aeo_batch",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("batch_seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("run_id", sa.String(250), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("handles", sa.Text),
    sa.Column("input_records", sa.BigInteger),
    sa.Column("output_records", sa.BigInteger),
    sa.Column("error", sa.Text),
    sa.Column("details", sa.Text),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("aeo_batch_run", "pipeline_id", "run_id"),
    sa.Index("aeo_batch_state", "pipeline_id", "state"),
)

batch_offsets = sa.Table(
    "aeo_batch_offset",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("batch_seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("topic", sa.String(249), primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True),
    sa.Column("start_offset", sa.BigInteger, nullable=False),
    sa.Column("end_offset", sa.BigInteger, nullable=False),
)

# Decisions worth an audit trail: skipped data after data loss, no-op replays, rewinds.
events = sa.Table(
    "aeo_event",
    metadata,
    sa.Column("event_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("pipeline_id", sa.String(250), nullable=False, index=True),
    sa.Column("batch_seq", sa.BigInteger),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
)

# Where a partition's position was moved on purpose, so that committed-position logic and
# the tiling check know about it: a rewind, or data loss accepted under data_loss_policy
# "skip". Batches numbered after `after_batch_seq` continue from `new_offset`.
position_resets = sa.Table(
    "aeo_position_reset",
    metadata,
    sa.Column("reset_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("pipeline_id", sa.String(250), nullable=False, index=True),
    sa.Column("topic", sa.String(249), nullable=False),
    sa.Column("partition", sa.Integer, nullable=False),
    sa.Column("new_offset", sa.BigInteger, nullable=False),
    sa.Column("after_batch_seq", sa.BigInteger, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),  # rewind | data-loss-skip
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
)

# Interval mode: the Airflow data interval [start, end) (epoch ms) each batch reads.
batch_intervals = sa.Table(
    "aeo_batch_interval",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("batch_seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("interval_start", sa.BigInteger, nullable=False),
    sa.Column("interval_end", sa.BigInteger, nullable=False),
    sa.Index("aeo_batch_interval_key", "pipeline_id", "interval_start", "interval_end"),
)

# Interval mode: the offset at which a point in time falls in each partition, fixed the
# first time a batch needs it. Adjacent intervals share it, so they tile the partition even
# when records arrive late or runs of neighbouring intervals overlap.
boundaries = sa.Table(
    "aeo_boundary",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("topic", sa.String(249), primary_key=True),
    sa.Column("partition", sa.Integer, primary_key=True),
    sa.Column("at_ms", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("boundary_offset", sa.BigInteger, nullable=False),
    sa.Column("origin", sa.String(200), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

# Which Airflow DAGs drive a pipeline (recorded by the plan task): the ledger page shows a
# pipeline only to users who may read all of its DAGs.
pipeline_dags = sa.Table(
    "aeo_pipeline_dag",
    metadata,
    sa.Column("pipeline_id", sa.String(250), primary_key=True),
    sa.Column("dag_id", sa.String(250), primary_key=True),
    sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
)

TopicPartition = tuple[str, int]
Reset = tuple[int, str]  # new offset, reason
Boundary = tuple[TopicPartition, int]  # partition, time (epoch ms)
_SCHEMA_LOCK = 0x61656F5F6C656467  # "aeo_ledg": the advisory lock key of schema creation



def create_tables(conn: Connection) -> None:
    """Create the tables that are missing, in the caller's transaction (on SQLite it holds the write lock)."""
    if conn.dialect.name == "postgresql":
        # Tasks starting on an empty database at once would race on the catalog.
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})")
    metadata.create_all(conn)
