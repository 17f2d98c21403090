"""Example: runs start when records arrive, not on a clock (Airflow 3's event-driven scheduling).

The DAG is scheduled on an Asset whose watcher is a PipelineBacklogTrigger: Airflow's
triggerer polls the topic's offsets and the ledger, and the Asset gets an event (so the DAG
a run) when enough records wait beyond the ledger's position, or when the oldest of them
waited too long. Also the system test of the trigger (tests/system/test_backlog_runs.py).
Settings come from the environment so that the tests can point it at their own broker; in
your own DAG, just write the values.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG
from example_transforms import EVENT_SCHEMA, select_events  # the DAG folder is on the Python path

from airflow_exactly_once.airflow_integration.assets import pipeline_backlog_asset
from airflow_exactly_once.task_group import exactly_once_batch
from airflow_exactly_once.triggers.backlog import PipelineBacklogTrigger

TOPIC = os.environ.get("EXACTLY_ONCE_ARRIVAL_TOPIC", "arrivals")
OUTPUT = os.environ.get(
    "EXACTLY_ONCE_ARRIVAL_OUTPUT",
    str(Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "exactly_once_output" / "arrivals"),
)
MIN_RECORDS = int(os.environ.get("EXACTLY_ONCE_ARRIVAL_MIN_RECORDS", "1000"))
MAX_WAIT_SECONDS = float(os.environ.get("EXACTLY_ONCE_ARRIVAL_MAX_WAIT_SECONDS", "300"))
POLL_SECONDS = float(os.environ.get("EXACTLY_ONCE_ARRIVAL_POLL_SECONDS", "5"))
LEDGER_CONN_ID = os.environ.get("EXACTLY_ONCE_LEDGER_CONN_ID")  # unset: the embedded SQLite ledger

# [START kafka_to_parquet_on_arrival]
backlog = PipelineBacklogTrigger(
    pipeline_id="kafka_to_parquet_on_arrival",  # the pipeline_id of exactly_once_batch below
    topics=[TOPIC],
    kafka_conn_id="kafka_default",
    ledger_conn_id=LEDGER_CONN_ID,  # the pipeline's ledger: the triggerer must read the same one
    min_records=MIN_RECORDS,  # a run as soon as this many records wait beyond the ledger ...
    max_wait_seconds=MAX_WAIT_SECONDS,  # ... or when the oldest waiting record is this old
    poll_interval_seconds=POLL_SECONDS,  # offsets only: cheap for the broker
)

with DAG(
    dag_id="kafka_to_parquet_on_arrival",
    description="Kafka -> Parquet, exactly once, a run when records arrive",
    schedule=[pipeline_backlog_asset("kafka_to_parquet_on_arrival", backlog)],
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,  # records arriving during a run lead to one more run, not a queue of them
    default_args={"retries": 3, "retry_delay": timedelta(seconds=2)},
    tags=["exactly-once", "example"],
):
    exactly_once_batch(
        pipeline_id="kafka_to_parquet_on_arrival",
        topics=[TOPIC],
        kafka_conn_id="kafka_default",
        ledger_conn_id=LEDGER_CONN_ID,
        sink={"type": "parquet", "path": OUTPUT},
        value_format="json",  # decoded by the provider: a malformed value is a bad record
        value_schema=EVENT_SCHEMA,
        transform=select_events,
        startup_mode="earliest",
        # A `spark_connect` connection: write on a warm Spark Connect server; None: a Spark driver in the task.
        spark_conn_id=os.environ.get("EXACTLY_ONCE_ARRIVAL_SPARK_CONN_ID"),
    )
# [END kafka_to_parquet_on_arrival]
