"""The DAG of benchmarks/bench_freshness.py (and tests/system/test_freshness_smoke.py): Kafka -> Kafka, a run
whenever records wait (an Asset whose watcher is the backlog trigger), one run at a time.

Its settings come from SETTINGS_FILE in the DAG folder, which the benchmark (or the smoke test) writes before it
links this file there: the session's Airflow in the tests runs with an environment fixed when it started, so the
environment cannot carry them. Without that file the module defines no DAG. Every setting the file leaves out
keeps the provider's documented default (e.g. the trigger's poll); `retention_batches`, when given, bounds the
ledger by count alone (retention_days None), so that the hour run's ledger stays at that many batches.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

from airflow.configuration import conf
from airflow.sdk import DAG

from airflow_exactly_once.airflow_integration.assets import pipeline_backlog_asset
from airflow_exactly_once.task_group import exactly_once_batch
from airflow_exactly_once.triggers.backlog import PipelineBacklogTrigger

SETTINGS_FILE = "bench_freshness.json"
settings_path = Path(conf.get("core", "dags_folder")) / SETTINGS_FILE

if settings_path.exists():
    settings = json.loads(settings_path.read_text())
    pipeline_id = settings["pipeline_id"]
    trigger_settings = {"poll_interval_seconds": settings["poll_interval_seconds"]} \
        if settings.get("poll_interval_seconds") is not None else {}
    retention = {"retention_batches": settings["retention_batches"], "retention_days": None} \
        if settings.get("retention_batches") is not None else {}
    backlog = PipelineBacklogTrigger(pipeline_id=pipeline_id, topics=[settings["input_topic"]],
                                     kafka_conn_id="kafka_default", **trigger_settings)

    with DAG(
        dag_id=settings["dag_id"],
        description="Freshness benchmark: Kafka -> Kafka exactly once, a run when records wait",
        schedule=[pipeline_backlog_asset(pipeline_id, backlog)],
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=1,
        default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
    ):
        exactly_once_batch(
            pipeline_id=pipeline_id,
            topics=[settings["input_topic"]],
            kafka_conn_id="kafka_default",
            # transform None: Kafka's own key and value, written as they came (the Spark query of the
            # benchmark selects the same two columns)
            sink={"type": "kafka", "topic": settings["output_topic"], "guarantee": "EXACTLY_ONCE",
                  "transaction_timeout_ms": 900_000},
            startup_mode="earliest",
            write_kwargs={"execution_timeout": timedelta(minutes=8)},
            notify_kwargs={"execution_timeout": timedelta(minutes=1), "retries": 3},
            spark_conn_id=settings.get("spark_conn_id"),
            **retention,
        )
