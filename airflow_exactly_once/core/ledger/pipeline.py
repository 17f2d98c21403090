"""Pipelines: their rows (epoch, fingerprint, stored config) and the Airflow DAGs that drive them."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.ledger.base import LedgerBase
from airflow_exactly_once.core.ledger.rows import utc_now
from airflow_exactly_once.core.ledger.schema import pipeline_dags, pipelines
from airflow_exactly_once.core.model import dumps


class PipelineLedger(LedgerBase):
    """Pipeline rows and the DAGs recorded for them."""

    def ensure_pipeline(self, pipeline_id: str, fingerprint: str, config: dict[str, Any]) -> int:
        """Create the pipeline row on first use, keep its fingerprint current; return the epoch."""
        self.create_schema()
        try:
            return self._ensure_pipeline(pipeline_id, fingerprint, config)
        except sa.exc.IntegrityError:
            # Another session created the row first (PostgreSQL does not serialise the two
            # reads like SQLite's BEGIN IMMEDIATE): the row exists now, so read it again.
            return self._ensure_pipeline(pipeline_id, fingerprint, config)

    def _ensure_pipeline(self, pipeline_id: str, fingerprint: str, config: dict[str, Any]) -> int:
        # Every plan calls this, and the row nearly always exists with this fingerprint: read it without a write
        # transaction (engine.read_connection); the returned epoch is a read like Planner._epoch's either way.
        with self._reading() as conn:
            row = conn.execute(sa.select(pipelines.c.epoch, pipelines.c.fingerprint)
                               .where(pipelines.c.pipeline_id == pipeline_id)).first()
        if row is not None and row.fingerprint == fingerprint:
            return row.epoch
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(pipelines).where(pipelines.c.pipeline_id == pipeline_id)).first()
            if row is None:
                conn.execute(
                    pipelines.insert().values(
                        pipeline_id=pipeline_id, epoch=0, fingerprint=fingerprint, config=dumps(config),
                        created_at=utc_now(), updated_at=utc_now(),
                    )
                )
                return 0
            if row.fingerprint != fingerprint:
                conn.execute(
                    pipelines.update()
                    .where(pipelines.c.pipeline_id == pipeline_id)
                    .values(fingerprint=fingerprint, config=dumps(config), updated_at=utc_now())
                )
                self._event(conn, pipeline_id, None, "config-changed",
                            f"configuration fingerprint is now {fingerprint}")
            return row.epoch

    def store_config(self, pipeline_id: str, config: dict[str, Any]) -> None:
        """Keep the stored settings current (servers, client options), not only the fingerprinted ones.

        A spark-submitted write reads its settings here, so a moved broker must show up.
        """
        with self.engine.begin() as conn:
            conn.execute(pipelines.update().where(pipelines.c.pipeline_id == pipeline_id)
                         .values(config=dumps(config), updated_at=utc_now()))

    def pipeline(self, pipeline_id: str) -> dict[str, Any] | None:
        with self._reading() as conn:
            row = conn.execute(sa.select(pipelines).where(pipelines.c.pipeline_id == pipeline_id)).first()
        if row is None:
            return None
        data = dict(row._mapping)
        data["config"] = json.loads(data["config"])
        return data

    def stored_config(self, pipeline_id: str) -> dict[str, Any]:
        """The settings stored for a pipeline of this ledger; for another one, an error naming those it has."""
        stored = self.pipeline(pipeline_id)
        if stored is None:
            known = ", ".join(p["pipeline_id"] for p in self.list_pipelines()) or "none"
            raise ConfigurationError(f"no pipeline {pipeline_id!r} in this ledger (known: {known})")
        return stored["config"]

    def list_pipelines(self) -> list[dict[str, Any]]:
        with self._reading() as conn:
            return [dict(r._mapping) for r in conn.execute(sa.select(pipelines).order_by(pipelines.c.pipeline_id))]

    # -- the DAGs that drive a pipeline ---------------------------------------------

    def record_dag(self, pipeline_id: str, dag_id: str) -> None:
        """Remember that `dag_id` drives `pipeline_id` (once; later calls read only)."""
        key = (pipeline_dags.c.pipeline_id == pipeline_id, pipeline_dags.c.dag_id == dag_id)
        with self._reading() as conn:
            if conn.execute(sa.select(pipeline_dags.c.dag_id).where(*key)).first() is not None:
                return
        try:
            with self.engine.begin() as conn:
                if conn.execute(sa.select(pipeline_dags.c.dag_id).where(*key)).first() is None:
                    conn.execute(pipeline_dags.insert().values(pipeline_id=pipeline_id, dag_id=dag_id,
                                                               first_seen_at=utc_now()))
        except sa.exc.IntegrityError:
            pass  # another task recorded the same pair at the same moment

    def pipeline_dags(self) -> dict[str, set[str]]:
        """{pipeline_id: the DAG ids recorded for it} (pipelines without any are left out)."""
        found: dict[str, set[str]] = {}
        with self._reading() as conn:
            for row in conn.execute(sa.select(pipeline_dags.c.pipeline_id, pipeline_dags.c.dag_id)):
                found.setdefault(row.pipeline_id, set()).add(row.dag_id)
        return found
