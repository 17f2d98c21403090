"""A DAG that does nothing: its runs give the ledger page's tests run ids that Airflow knows
(a pipeline whose plan tasks did not record their DAG is attributed through its batches' run ids)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, task

with DAG(dag_id="eo_ui_noop", schedule=None, start_date=datetime(2024, 1, 1), catchup=False, tags=["test"]):

    @task
    def nothing() -> None:
        return None

    nothing()
