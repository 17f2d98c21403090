"""Example: a topic in the Schema Registry wire format (Avro, several schema versions) -> Parquet, exactly once.

Each record names its writer schema by id; the provider fetches the writer schemas once per
batch from the registry of the `schema_registry` connection, resolves them to the subject's
latest version (Avro schema evolution: added fields with defaults, promotions) and hands the
transform typed columns. Records that are not in the wire format, name an unknown id, cannot be
resolved or are truncated go to the dead letters, committed with the batch.

Also the system test of the registry formats (tests/system/test_pipeline_registry.py runs it).
Settings come from the environment so that the tests can point it at their own broker.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch

OUTPUT = os.environ.get(
    "EXACTLY_ONCE_DEMO_REGISTRY_OUTPUT",
    str(Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "exactly_once_output" / "orders_avro"),
)


def paid_orders(df):
    """Typed columns in (the reader schema's fields), the paid orders out."""
    return df.where("status = 'PAID'").select("id", "item", "amount", "note")


# [START kafka_to_parquet_registry]
with DAG(
    dag_id="kafka_to_parquet_registry",
    description="Avro in the Schema Registry wire format -> Parquet, exactly once",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
    tags=["exactly-once", "example"],
):
    exactly_once_batch(
        pipeline_id="orders_avro",
        topics=[os.environ.get("EXACTLY_ONCE_DEMO_REGISTRY_TOPIC", "orders")],
        kafka_conn_id="kafka_default",
        # Type schema_registry: Host = the registry URL, Login/Password = basic auth (a Password alone: a
        # bearer token), extra = TLS files ({"ssl.ca.location": ..., "ssl.certificate.location": ...}).
        schema_registry_conn_id="schema_registry_default",
        value_format="avro",  # the wire format: writer schema by id, read as subject "orders-value"'s latest
        # value_schema=3 pins version 3 of the subject as the reader schema instead.
        bad_record_policy="dead_letter",
        max_bad_records=0.05,  # more than 5 % bad fails the batch whatever the policy
        sink={"type": "parquet", "path": OUTPUT},
        transform=paid_orders,
        # A `spark_connect` connection: write on a warm Spark Connect server; None: a Spark driver in the task.
        spark_conn_id=os.environ.get("EXACTLY_ONCE_DEMO_REGISTRY_SPARK_CONN_ID"),
        max_records_per_partition=int(os.environ.get("EXACTLY_ONCE_DEMO_MAX_RECORDS", "1000")),
    )
# [END kafka_to_parquet_registry]
