"""0001: the ledger as the releases before versioning wrote it (the nine tables and their indexes).

Revision ID: 0001
Revises:
Create Date: 2026-11-25

A frozen copy, not an import of schema.py: later schema changes go into later revisions. Tables
that exist are left alone (checkfirst), so a ledger written before versioning is adopted by this
same step: its missing tables (if an older release had fewer) are added, then it is stamped 0001.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _tables() -> sa.MetaData:
    meta = sa.MetaData()
    key: dict[str, Any] = {"primary_key": True}
    required: dict[str, Any] = {"nullable": False}

    def pipeline_id(**role: Any) -> sa.Column:
        return sa.Column("pipeline_id", sa.String(250), **role)

    def batch_seq() -> sa.Column:
        return sa.Column("batch_seq", sa.BigInteger, primary_key=True, autoincrement=False)

    def at(name: str) -> sa.Column:
        return sa.Column(name, sa.DateTime(timezone=True), nullable=False)

    def topic_partition(role: dict[str, Any]) -> list[sa.Column]:
        return [sa.Column("topic", sa.String(249), **role), sa.Column("partition", sa.Integer, **role)]

    sa.Table("aeo_pipeline", meta, pipeline_id(**key), sa.Column("epoch", sa.BigInteger, **required),
             sa.Column("fingerprint", sa.String(64), **required), sa.Column("config", sa.Text, **required),
             at("created_at"), at("updated_at"))
    sa.Table("aeo_partition", meta, pipeline_id(**key), *topic_partition(key),
             sa.Column("initial_offset", sa.BigInteger, **required), sa.Column("origin", sa.String(200), **required),
             at("created_at"))
    sa.Table("aeo_batch", meta, pipeline_id(**key), batch_seq(), sa.Column("run_id", sa.String(250), **required),
             sa.Column("state", sa.String(16), **required), sa.Column("epoch", sa.BigInteger, **required),
             sa.Column("handles", sa.Text), sa.Column("input_records", sa.BigInteger),
             sa.Column("output_records", sa.BigInteger), sa.Column("error", sa.Text), sa.Column("details", sa.Text),
             at("created_at"), at("updated_at"),
             sa.Index("aeo_batch_run", "pipeline_id", "run_id"), sa.Index("aeo_batch_state", "pipeline_id", "state"))
    sa.Table("aeo_batch_offset", meta, pipeline_id(**key), batch_seq(), *topic_partition(key),
             sa.Column("start_offset", sa.BigInteger, **required), sa.Column("end_offset", sa.BigInteger, **required))
    sa.Table("aeo_event", meta, sa.Column("event_id", sa.Integer, primary_key=True, autoincrement=True),
             pipeline_id(nullable=False, index=True), sa.Column("batch_seq", sa.BigInteger),
             sa.Column("kind", sa.String(64), **required), sa.Column("message", sa.Text, **required), at("at"))
    sa.Table("aeo_position_reset", meta, sa.Column("reset_id", sa.Integer, primary_key=True, autoincrement=True),
             pipeline_id(nullable=False, index=True), *topic_partition(required),
             sa.Column("new_offset", sa.BigInteger, **required),
             sa.Column("after_batch_seq", sa.BigInteger, **required),
             sa.Column("kind", sa.String(32), **required), sa.Column("reason", sa.Text, **required), at("at"))
    sa.Table("aeo_batch_interval", meta, pipeline_id(**key), batch_seq(),
             sa.Column("interval_start", sa.BigInteger, **required),
             sa.Column("interval_end", sa.BigInteger, **required),
             sa.Index("aeo_batch_interval_key", "pipeline_id", "interval_start", "interval_end"))
    sa.Table("aeo_boundary", meta, pipeline_id(**key), *topic_partition(key),
             sa.Column("at_ms", sa.BigInteger, primary_key=True, autoincrement=False),
             sa.Column("boundary_offset", sa.BigInteger, **required), sa.Column("origin", sa.String(200), **required),
             at("created_at"))
    sa.Table("aeo_pipeline_dag", meta, pipeline_id(**key), sa.Column("dag_id", sa.String(250), primary_key=True),
             at("first_seen_at"))
    return meta


def upgrade() -> None:
    _tables().create_all(op.get_bind(), checkfirst=True)


def downgrade() -> None:
    raise NotImplementedError("the ledger is never downgraded: restore a backup instead")
