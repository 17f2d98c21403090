"""Example: Kafka topic -> transform -> an Apache Iceberg table, exactly once, one micro-batch per DAG run.

Each batch is staged as an Iceberg snapshot that readers of main do not see (write-audit-publish),
and notify_complete publishes it to main with pyiceberg (no Spark). The embedded catalog (a SQLite
file under the warehouse) needs no server; in production point the catalog at PostgreSQL with an
Airflow `postgres` connection (the docker/ stack's `iceberg_catalog`). Settings come from the
environment so that the demo and the tests can point it at their own broker; in your own DAG, just
write the values. Also the system test of the Iceberg sink (tests/system/test_pipeline_iceberg.py).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG
from example_transforms import EVENT_SCHEMA, select_events  # the DAG folder is on the Python path

from airflow_exactly_once.task_group import exactly_once_batch

WAREHOUSE = os.environ.get(
    "EXACTLY_ONCE_DEMO_ICEBERG_WAREHOUSE",
    str(Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "exactly_once_output" / "lakehouse"),
)
# An Airflow postgres connection for the production catalog; unset: the embedded one.
CATALOG_CONN = os.environ.get("EXACTLY_ONCE_DEMO_ICEBERG_CATALOG_CONN")
CATALOG = {"type": "postgres", "conn_id": CATALOG_CONN} if CATALOG_CONN else {"type": "embedded"}

# [START kafka_to_iceberg]
with DAG(
    dag_id="kafka_to_iceberg",
    description="Kafka -> Iceberg, exactly once (write-audit-publish)",
    schedule=None,  # e.g. "*/5 * * * *": every run is one micro-batch
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,  # continuation mode: one batch after the other
    default_args={"retries": 3, "retry_delay": timedelta(seconds=2)},
    tags=["exactly-once", "example"],
):
    exactly_once_batch(
        pipeline_id="kafka_to_iceberg",
        topics=[os.environ.get("EXACTLY_ONCE_DEMO_ICEBERG_TOPIC", "events_iceberg")],
        kafka_conn_id="kafka_default",  # extra: {"bootstrap.servers": "host:port"}
        sink={
            "type": "iceberg",
            "table": "lake.events",  # namespace.name; Spark sees it as iceberg.lake.events
            "warehouse": WAREHOUSE,  # where the table's files go (a path, or s3://... with a postgres catalog)
            "catalog": CATALOG,
            "create_table": True,  # the first write creates it from the transform's schema
        },
        value_format="json",  # decoded by the provider: a malformed value is a bad record
        value_schema=EVENT_SCHEMA,
        transform=select_events,
        startup_mode="earliest",
        max_records_per_partition=int(os.environ.get("EXACTLY_ONCE_DEMO_MAX_RECORDS", "1000")),
    )
# [END kafka_to_iceberg]
