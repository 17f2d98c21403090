"""The ledger's SQL schema: the eleven tables, in one place (created and upgraded by versioning.py's migrations).

Every concern of the ledger reads and writes these tables through SQLAlchemy Core, so the
same definitions serve the embedded SQLite file and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

metadata = sa.MetaData()


# The columns several tables share, defined once: the same name, type and key role everywhere.

def _table(name: str, *columns: sa.Column | sa.Index) -> sa.Table:
    return sa.Table(name, metadata, *columns)


def _pipeline_id(*, key: bool = True) -> sa.Column:
    """The pipeline a row belongs to: the first part of the primary key, or (`key=False`) an indexed column."""
    if key:
        return sa.Column("pipeline_id", sa.String(250), primary_key=True)
    return sa.Column("pipeline_id", sa.String(250), nullable=False, index=True)


def _batch_key() -> list[sa.Column]:
    """A batch: its pipeline and its number."""
    return [_pipeline_id(), sa.Column("batch_seq", sa.BigInteger, primary_key=True, autoincrement=False)]


def _topic_partition(*, key: bool) -> list[sa.Column]:
    """A Kafka partition: part of the primary key, or (`key=False`) plain required columns."""
    role: dict[str, Any] = {"primary_key": True} if key else {"nullable": False}
    return [sa.Column("topic", sa.String(249), **role), sa.Column("partition", sa.Integer, **role)]


def _time(name: str) -> sa.Column:
    """A required, timezone-aware point in time."""
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


pipelines = _table(
    "aeo_pipeline",
    _pipeline_id(),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("fingerprint", sa.String(64), nullable=False),
    sa.Column("config", sa.Text, nullable=False),
    _time("created_at"),
    _time("updated_at"),
)

# Where each partition started: resolved once from the startup mode (or the policy for
# partitions added later) and then fixed, so "latest" means latest when first seen.
partitions = _table(
    "aeo_partition",
    _pipeline_id(),
    *_topic_partition(key=True),
    sa.Column("initial_offset", sa.BigInteger, nullable=False),
    sa.Column("origin", sa.String(200), nullable=False),
    _time("created_at"),
)

batches = _table(
    "aeo_batch",
    *_batch_key(),
    sa.Column("run_id", sa.String(250), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("handles", sa.Text),
    sa.Column("input_records", sa.BigInteger),
    sa.Column("output_records", sa.BigInteger),
    sa.Column("error", sa.Text),
    sa.Column("details", sa.Text),
    _time("created_at"),
    _time("updated_at"),
    # A run's newest batch, and the newest batches in a state, read from an index range alone however long
    # the history (planning, committed positions, retention); revision 0002 replaced the (pipeline_id, run_id)
    # and (pipeline_id, state) indexes, with which a max() or ORDER BY batch_seq walked every batch.
    sa.Index("aeo_batch_run_seq", "pipeline_id", "run_id", "batch_seq"),
    sa.Index("aeo_batch_state_seq", "pipeline_id", "state", "batch_seq"),
)

batch_offsets = _table(
    "aeo_batch_offset",
    *_batch_key(),
    *_topic_partition(key=True),
    sa.Column("start_offset", sa.BigInteger, nullable=False),
    sa.Column("end_offset", sa.BigInteger, nullable=False),
)

# Decisions worth an audit trail: skipped data after data loss, no-op replays, rewinds.
events = _table(
    "aeo_event",
    sa.Column("event_id", sa.Integer, primary_key=True, autoincrement=True),
    _pipeline_id(key=False),
    sa.Column("batch_seq", sa.BigInteger),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    _time("at"),
    sa.Index("aeo_event_batch", "pipeline_id", "batch_seq"),  # retention deletes a batch's events by it
)

# Where a partition's position was moved on purpose, so that committed-position logic and
# the tiling check know about it: a rewind, or data loss accepted under data_loss_policy
# "skip". Batches numbered after `after_batch_seq` continue from `new_offset`.
position_resets = _table(
    "aeo_position_reset",
    sa.Column("reset_id", sa.Integer, primary_key=True, autoincrement=True),
    _pipeline_id(key=False),
    *_topic_partition(key=False),
    sa.Column("new_offset", sa.BigInteger, nullable=False),
    sa.Column("after_batch_seq", sa.BigInteger, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),  # rewind | data-loss-skip
    sa.Column("reason", sa.Text, nullable=False),
    _time("at"),
)

# Interval mode: the Airflow data interval [start, end) (epoch ms) each batch reads.
batch_intervals = _table(
    "aeo_batch_interval",
    *_batch_key(),
    sa.Column("interval_start", sa.BigInteger, nullable=False),
    sa.Column("interval_end", sa.BigInteger, nullable=False),
    sa.Index("aeo_batch_interval_key", "pipeline_id", "interval_start", "interval_end"),
)

# Interval mode: the offset at which a point in time falls in each partition, fixed the
# first time a batch needs it. Adjacent intervals share it, so they tile the partition even
# when records arrive late or runs of neighbouring intervals overlap.
boundaries = _table(
    "aeo_boundary",
    _pipeline_id(),
    *_topic_partition(key=True),
    sa.Column("at_ms", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("boundary_offset", sa.BigInteger, nullable=False),
    sa.Column("origin", sa.String(200), nullable=False),
    _time("created_at"),
)

# Which Airflow DAGs drive a pipeline (recorded by the plan task): the ledger page shows a
# pipeline only to users who may read all of its DAGs.
pipeline_dags = _table(
    "aeo_pipeline_dag",
    _pipeline_id(),
    sa.Column("dag_id", sa.String(250), primary_key=True),
    _time("first_seen_at"),
)

# Retention (core.retention): the batches of a pipeline numbered up to `batch_seq` were pruned, and
# `interval_end` (interval mode, epoch ms) is the latest data-interval end among them: an interval
# starting before it, with no batch left, is refused rather than run again blindly.
prune_floors = _table(
    "aeo_prune_floor",
    _pipeline_id(),
    sa.Column("batch_seq", sa.BigInteger, nullable=False),
    sa.Column("interval_end", sa.BigInteger),
    sa.Column("pruned_batches", sa.BigInteger, nullable=False),
    _time("pruned_at"),
    # When batch `batch_seq` (the newest pruned) was planned: a cleared run created before it may have had a
    # batch that is gone, so it must not plan a new one (core.planning: a re-run never takes newer data).
    sa.Column("batch_created_at", sa.DateTime(timezone=True)),
)

# Retention: per partition, the committed position right after the pipeline's pruned batches (the
# floor batch_seq above): committed positions, the tiling check and rewinds start from it.
partition_floors = _table(
    "aeo_partition_floor",
    _pipeline_id(),
    *_topic_partition(key=True),
    sa.Column("floor_offset", sa.BigInteger, nullable=False),
)

TopicPartition = tuple[str, int]
Reset = tuple[int, str]  # new offset, reason
Boundary = tuple[TopicPartition, int]  # partition, time (epoch ms)
