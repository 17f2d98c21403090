"""Example: Kafka topic -> transform -> Parquet, exactly once, one micro-batch per DAG run.

Also the system test of the Parquet sink (tests/system/test_pipeline_parquet.py runs it).
Settings come from the environment so that `make demo` and the tests can point it at
their own broker; in your own DAG, just write the values.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG
from example_transforms import EVENT_SCHEMA, select_events  # the DAG folder is on the Python path

from airflow_exactly_once.task_group import exactly_once_batch

OUTPUT = os.environ.get(
    "EXACTLY_ONCE_DEMO_OUTPUT",
    str(Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "exactly_once_output" / "kafka_to_parquet"),
)


# [START kafka_to_parquet]
with DAG(
    dag_id="kafka_to_parquet",
    description="Kafka -> Parquet, exactly once",
    schedule=None,  # e.g. "*/5 * * * *": every run is one micro-batch
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,  # continuation mode: one batch after the other
    default_args={"retries": 3, "retry_delay": timedelta(seconds=2)},
    tags=["exactly-once", "example"],
):
    exactly_once_batch(
        pipeline_id="kafka_to_parquet",
        topics=[os.environ.get("EXACTLY_ONCE_DEMO_TOPIC", "events")],
        kafka_conn_id="kafka_default",  # extra: {"bootstrap.servers": "host:port"}
        sink={"type": "parquet", "path": OUTPUT},
        value_format="json",  # decoded by the provider: a malformed value is a bad record
        value_schema=EVENT_SCHEMA,
        # Bad records go to <path>/_dead_letter, committed with the batch (default policy: fail the batch).
        bad_record_policy="dead_letter",
        transform=select_events,
        # A `spark_connect` connection: write on a warm Spark Connect server; None: a Spark driver in the task.
        spark_conn_id=os.environ.get("EXACTLY_ONCE_DEMO_SPARK_CONN_ID"),
        startup_mode="earliest",
        max_records_per_partition=int(os.environ.get("EXACTLY_ONCE_DEMO_MAX_RECORDS", "1000")),
    )
# [END kafka_to_parquet]
