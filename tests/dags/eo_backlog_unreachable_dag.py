"""Backlog watchers of a broker that never answers and of a ledger that hangs up (tests/system/test_backlog_runs.py).

Their triggers must report the error in the triggerer's log and keep polling; the triggerer,
and the other watchers it runs, carry on. The DAGs never run.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, task

from airflow_exactly_once.airflow_integration.assets import pipeline_backlog_asset
from airflow_exactly_once.triggers.backlog import PipelineBacklogTrigger

KAFKA = os.environ.get("EO_UNREACHABLE_KAFKA", "127.0.0.1:9")
LEDGER = os.environ.get("EO_UNREACHABLE_LEDGER", "postgresql+psycopg2://postgres@127.0.0.1:9/ledger")

WATCHERS = {
    "eo_backlog_no_broker": PipelineBacklogTrigger(pipeline_id="eo_backlog_no_broker", topics=["nowhere"],
                                                   kafka_conn_id=None, bootstrap_servers=KAFKA,
                                                   poll_interval_seconds=2, kafka_timeout_ms=2000),
    "eo_backlog_no_ledger": PipelineBacklogTrigger(pipeline_id="eo_backlog_no_ledger", topics=["arrivals"],
                                                   ledger_url=LEDGER, poll_interval_seconds=2),
}

for dag_id, trigger in WATCHERS.items():
    with DAG(dag_id=dag_id, schedule=[pipeline_backlog_asset(dag_id, trigger)], start_date=datetime(2024, 1, 1),
             catchup=False, tags=["exactly-once", "test"]):

        @task
        def never_runs() -> None:
            raise AssertionError("the backlog watcher of an unreachable broker or ledger must never fire")

        never_runs()
