"""Example: Kafka topic -> transform -> PostgreSQL table, exactly once, with true two-phase commit.

Each Spark partition writes its rows in one transaction and ends it with PREPARE TRANSACTION;
notify_complete runs COMMIT PREPARED. The offset ledger lives in the same PostgreSQL database
(ledger_conn_id), so rows and offsets sit side by side. The server needs
max_prepared_transactions > 0 (plan checks it and says how to set it).

Also the system test of the PostgreSQL sink (tests/system/test_pipeline_postgres.py runs it).
Settings come from the environment so that the tests can point it at their own broker and
server; in your own DAG, just write the values.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.common.sql.operators.sql import SQLExecuteQueryOperator
from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch

POSTGRES_CONN_ID = os.environ.get("EXACTLY_ONCE_DEMO_POSTGRES_CONN", "postgres_default")
TABLE = os.environ.get("EXACTLY_ONCE_DEMO_PG_TABLE", "events")


def select_events(df):
    """Decoded events in (value_format="json"), the table's rows out, with where each record came from."""
    from pyspark.sql import functions as F

    return df.select(
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("id"),
        F.col("name"),
        F.col("amount"),
        F.col("timestamp").alias("kafka_timestamp"),
    )


with DAG(
    dag_id="kafka_to_postgres",
    description="Kafka -> PostgreSQL, exactly once (PREPARE TRANSACTION / COMMIT PREPARED)",
    schedule=None,  # e.g. "*/5 * * * *": every run is one micro-batch
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,  # continuation mode: one batch after the other
    default_args={"retries": 3, "retry_delay": timedelta(seconds=2)},
    tags=["exactly-once", "example"],
):
    # The sink never creates tables: their types and keys are yours. The primary key on the
    # Kafka coordinates is a second line of defence; exactly-once does not depend on it.
    create_table = SQLExecuteQueryOperator(
        task_id="create_table",
        conn_id=POSTGRES_CONN_ID,
        sql=f"""
            CREATE TABLE IF NOT EXISTS {TABLE} (
                topic           text        NOT NULL,
                "partition"     integer     NOT NULL,
                "offset"        bigint      NOT NULL,
                id              bigint,
                name            text,
                amount          double precision CHECK (amount >= 0),
                kafka_timestamp timestamptz,
                PRIMARY KEY (topic, "partition", "offset")
            )""",
    )
    # [START kafka_to_postgres]
    batch = exactly_once_batch(
        pipeline_id="kafka_to_postgres",
        topics=[os.environ.get("EXACTLY_ONCE_DEMO_PG_TOPIC", "events")],
        kafka_conn_id="kafka_default",  # extra: {"bootstrap.servers": "host:port"}
        sink={"type": "postgres", "conn_id": POSTGRES_CONN_ID, "table": TABLE, "mode": "insert"},
        ledger_conn_id=POSTGRES_CONN_ID,  # the offset ledger in the same database
        value_format="json",  # decoded by the provider: a malformed value fails the batch, naming it
        value_schema="id BIGINT, name STRING, amount DOUBLE",
        transform=select_events,
        startup_mode="earliest",
        max_records_per_partition=int(os.environ.get("EXACTLY_ONCE_DEMO_MAX_RECORDS", "1000")),
    )
    create_table >> batch
    # [END kafka_to_postgres]
