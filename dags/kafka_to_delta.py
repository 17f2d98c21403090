"""Example: Kafka topic -> transform -> a Delta Lake table, exactly once, one micro-batch per DAG run.

Spark stages each batch as Parquet files inside the table's folder, where no Delta reader looks
(`_aeo_staging/`), and notify_complete publishes them with one Delta commit made by delta-rs (no
Spark), which carries the batch as an application transaction: one table version per batch, a
replayed commit adds nothing. Records that are not JSON of the schema go to a Delta table of their
own, `<path>/_dead_letter`, committed with the batch. Settings come from the environment so that
the demo and the tests can point it at their own broker; in your own DAG, just write the values.
Also the system test of the Delta sink (tests/system/test_pipeline_delta.py).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG
from example_transforms import EVENT_SCHEMA, select_events_by_day  # the DAG folder is on the Python path

from airflow_exactly_once.task_group import exactly_once_batch

TABLE = os.environ.get(
    "EXACTLY_ONCE_DEMO_DELTA_PATH",
    str(Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "exactly_once_output" / "delta" / "events"),
)

# [START kafka_to_delta]
with DAG(
    dag_id="kafka_to_delta",
    description="Kafka -> Delta Lake, exactly once (one table version per batch)",
    schedule=None,  # e.g. "*/5 * * * *": every run is one micro-batch
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,  # continuation mode: one batch after the other
    default_args={"retries": 3, "retry_delay": timedelta(seconds=2)},
    tags=["exactly-once", "example"],
):
    exactly_once_batch(
        pipeline_id="kafka_to_delta",
        topics=[os.environ.get("EXACTLY_ONCE_DEMO_DELTA_TOPIC", "events_delta")],
        kafka_conn_id="kafka_default",  # extra: {"bootstrap.servers": "host:port"}
        sink={
            "type": "delta",
            "path": TABLE,  # the table's folder: every worker and the Spark driver see it at this path
            "create_table": True,  # the first write creates it from the transform's schema (delta-rs)
            "partitioned_by": ["day"],
        },
        value_format="json",  # decoded by the provider: a malformed value is a bad record
        value_schema=EVENT_SCHEMA,
        bad_record_policy="dead_letter",  # into the Delta table <path>/_dead_letter, committed with the batch
        transform=select_events_by_day,
        startup_mode="earliest",
        max_records_per_partition=int(os.environ.get("EXACTLY_ONCE_DEMO_MAX_RECORDS", "1000")),
        spark_conn_id=os.environ.get("EXACTLY_ONCE_DEMO_DELTA_SPARK_CONN_ID"),  # unset: Spark in the write task
    )
# [END kafka_to_delta]
