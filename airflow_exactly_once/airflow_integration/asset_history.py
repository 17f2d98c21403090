"""The Asset events Airflow recorded for a pipeline, read from Airflow's metadata database.

The drift check (observe/drift.py) compares them with the ledger. It runs where that database is
reachable anyway: the `airflow` CLI's machines and the api-server (the ledger page); task processes,
which may not reach it on Airflow 3, never call this.
"""

from __future__ import annotations

from datetime import datetime

from airflow.models.asset import AssetEvent, AssetModel
from airflow.utils.session import create_session
from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from airflow_exactly_once.observe.drift import RecordedEvent
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.lineage_names import pipeline_asset_uri


def recorded_batch_events(pipeline_id: str, session: Session | None = None, since: datetime | None = None,
                          newest: int | None = None) -> list[RecordedEvent]:
    """The events of the pipeline's Asset recorded at or after `since` (None: all), oldest first (none when Airflow
    never recorded one). `newest`: only the newest so many, read backwards along Airflow's (asset_id, timestamp)
    index: the ledger page's bound, whatever Airflow holds."""
    query: Select = (select(AssetEvent.extra, AssetEvent.source_dag_id, AssetEvent.source_run_id,
                            AssetEvent.source_task_id, AssetEvent.timestamp)
                     .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
                     .where(AssetModel.uri == pipeline_asset_uri(pipeline_id)))
    if since is not None:
        # Airflow 3.1 declares the column so that mypy reads this comparison as a bool; 3.3 as a clause.
        query = query.where(AssetEvent.timestamp >= since)  # type: ignore[arg-type, unused-ignore]
    if newest is None:
        query = query.order_by(AssetEvent.id)
    else:
        query = query.order_by(AssetEvent.timestamp.desc(), AssetEvent.id.desc()).limit(newest)
    try:
        if session is not None:
            rows = session.execute(query).all()
        else:
            with create_session() as own:
                rows = own.execute(query).all()
    except Exception as exc:
        raise ConfigurationError(f"could not read Airflow's Asset events of {pipeline_asset_uri(pipeline_id)} from "
                                 f"Airflow's metadata database: {type(exc).__name__}: {exc}; run the check where "
                                 "Airflow's [database] sql_alchemy_conn is set (where `airflow` commands work), or "
                                 "leave the events out with --without asset-events") from exc
    return [RecordedEvent.from_extra(extra, "/".join(filter(None, (dag, run, task))) or "Airflow's API",
                                     at.isoformat() if at else "")
            for extra, dag, run, task, at in (rows if newest is None else reversed(rows))]
