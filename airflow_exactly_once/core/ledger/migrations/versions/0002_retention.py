"""0002: retention (core/retention.py): the pruned floor of each pipeline and partition; indexes for long histories.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-25

`aeo_prune_floor` says up to which batch a pipeline's history was pruned (and, interval mode, the end
of the pruned intervals); `aeo_partition_floor` keeps per partition the committed position after
it. `aeo_batch_state_seq` lets committed positions and retention read the newest batches in a
state from an index range, however long the history, and `aeo_batch_run_seq` a run's newest batch
(planning asks for it every run); they replace `aeo_batch_state` and `aeo_batch_run`, their
prefixes, with which max() or ORDER BY batch_seq walked every batch of the pipeline (measured by
benchmarks/bench_ledger_scale.py). `aeo_event_batch` lets a prune delete the events of the batches
it removes without reading all of a pipeline's events. New tables and indexes only: no row is
rewritten. What
exists already is left alone, like 0001 does, so a ledger adopted from a build that created these
tables without versioning upgrades as well.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    tables = set(inspector.get_table_names())

    def pipeline_id() -> sa.Column:
        return sa.Column("pipeline_id", sa.String(250), primary_key=True)

    def index(name: str, table: str, columns: list[str]) -> None:
        if name not in {i["name"] for i in inspector.get_indexes(table)}:
            op.create_index(name, table, columns)

    if "aeo_prune_floor" not in tables:
        op.create_table("aeo_prune_floor", pipeline_id(),
                        sa.Column("batch_seq", sa.BigInteger, nullable=False),
                        sa.Column("interval_end", sa.BigInteger),
                        sa.Column("pruned_batches", sa.BigInteger, nullable=False),
                        sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=False),
                        sa.Column("batch_created_at", sa.DateTime(timezone=True)))
    if "aeo_partition_floor" not in tables:
        op.create_table("aeo_partition_floor", pipeline_id(),
                        sa.Column("topic", sa.String(249), primary_key=True),
                        sa.Column("partition", sa.Integer, primary_key=True),
                        sa.Column("floor_offset", sa.BigInteger, nullable=False))
    index("aeo_batch_run_seq", "aeo_batch", ["pipeline_id", "run_id", "batch_seq"])
    index("aeo_batch_state_seq", "aeo_batch", ["pipeline_id", "state", "batch_seq"])
    existing = {i["name"] for i in inspector.get_indexes("aeo_batch")}
    for replaced in ("aeo_batch_run", "aeo_batch_state"):
        if replaced in existing:
            op.drop_index(replaced, table_name="aeo_batch")
    index("aeo_event_batch", "aeo_event", ["pipeline_id", "batch_seq"])


def downgrade() -> None:
    raise NotImplementedError("the ledger is never downgraded: restore a backup instead")
