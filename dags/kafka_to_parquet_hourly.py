"""Example: one exactly-once batch per hour of record time (interval mode), made for backfills.

Each run reads the Kafka records whose timestamps fall in its data interval, so a backfill
over a date range (Airflow UI: "Backfill", or `POST /api/v2/backfills`) writes one batch per
hour, several hours in parallel. Clearing a run re-reads exactly the same records and
replaces that hour's output (interval_rerun="replace").

The DAG starts paused: unpause it when its topic exists. Settings come from the
environment so that the tests and `make demo` can point it at their own broker.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable

from airflow_exactly_once.task_group import exactly_once_batch

OUTPUT = os.environ.get(
    "EXACTLY_ONCE_HOURLY_OUTPUT",
    str(Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "exactly_once_output" / "hourly"),
)


def with_event_time(df):
    """Key and value as text, plus the record's own timestamp: the column the hours are cut by."""
    return df.selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value",
                         "timestamp AS event_time", "partition", "offset")


# [START kafka_to_parquet_hourly]
with DAG(
    dag_id="kafka_to_parquet_hourly",
    description="Kafka -> Parquet, exactly once, one batch per hour of record time",
    # Data intervals, not trigger times: in Airflow 3 a plain "@hourly" gives runs empty intervals.
    schedule=CronDataIntervalTimetable("@hourly", timezone="UTC"),
    start_date=datetime(2024, 1, 1),
    catchup=False,  # past hours come from backfills, on demand
    max_active_runs=4,  # hours are independent: they may run side by side
    is_paused_upon_creation=True,
    default_args={"retries": 3, "retry_delay": timedelta(seconds=30)},
    tags=["exactly-once", "example"],
):
    exactly_once_batch(
        pipeline_id="kafka_to_parquet_hourly",
        topics=[os.environ.get("EXACTLY_ONCE_DEMO_TOPIC", "events")],
        kafka_conn_id="kafka_default",
        sink={"type": "parquet", "path": OUTPUT},
        transform=with_event_time,
        range_mode="interval",
        interval_rerun="replace",
    )
# [END kafka_to_parquet_hourly]
