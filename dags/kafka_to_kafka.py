"""Example: Kafka topic -> transform -> Kafka topic, exactly once, one micro-batch per DAG run.

Also the system test of the Kafka sink (tests/system/test_pipeline_kafka.py runs it). The write
task leaves one Kafka transaction per Spark partition open (pre-committed); only
notify_complete commits them, so consumers with isolation.level=read_committed see each
input record's result exactly once, whatever crashed in between.

Settings come from the environment so that `make demo` and the tests can point it at
their own broker; in your own DAG, just write the values.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch

INPUT_TOPIC = os.environ.get("EXACTLY_ONCE_DEMO_K2K_INPUT", "events")
OUTPUT_TOPIC = os.environ.get("EXACTLY_ONCE_DEMO_K2K_OUTPUT", "events_enriched")


def enrich_events(df):
    """JSON events in, enriched JSON out, keyed by event id (the sink writes `key` and `value`)."""
    from pyspark.sql import functions as F

    event = F.from_json(F.col("value").cast("string"), "id BIGINT, name STRING, amount DOUBLE")
    return df.select(event.alias("e"), "topic", "partition", "offset").select(
        F.col("e.id").cast("string").alias("key"),
        F.to_json(F.struct(
            F.col("e.id").alias("id"),
            F.upper(F.col("e.name")).alias("name"),
            F.round(F.col("e.amount") * 100).cast("long").alias("amount_cents"),
            F.concat_ws(":", "topic", "partition", "offset").alias("source"),
        )).alias("value"),
    )


with DAG(
    dag_id="kafka_to_kafka",
    description="Kafka -> Kafka, exactly once (transactional sink committed by notify_complete)",
    schedule=None,  # e.g. "*/5 * * * *": every run is one micro-batch
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,  # continuation mode: one batch after the other
    default_args={"retries": 2, "retry_delay": timedelta(seconds=5)},
    tags=["exactly-once", "example"],
):
    # [START kafka_to_kafka]
    exactly_once_batch(
        pipeline_id="kafka_to_kafka",
        topics=[INPUT_TOPIC],
        kafka_conn_id="kafka_default",  # extra: {"bootstrap.servers": "host:port"}
        sink={
            "type": "kafka",
            "topic": OUTPUT_TOPIC,  # must exist; consumers read it with isolation.level=read_committed
            # Must outlive write + every notify_complete retry (checked at plan time: docs/sinks/kafka.md),
            # and stay within the brokers' transaction.max.timeout.ms (15 min by default).
            "transaction_timeout_ms": 900_000,
            "producer_config": {"linger.ms": 20},
            "guarantee": "EXACTLY_ONCE",  # or AT_LEAST_ONCE / NONE (cheaper, weaker: docs/sinks/kafka.md)
        },
        mirror_consumer_group="kafka_to_kafka",  # committed offsets for lag dashboards (monitoring only)
        transform=enrich_events,
        max_records_per_partition=int(os.environ.get("EXACTLY_ONCE_DEMO_MAX_RECORDS", "1000")),
        # A transaction lives from write to the last notify_complete retry: bound both
        # (8 min + 4 x 1 min + 3 x 5 s = 735 s < 900 s).
        write_kwargs={"execution_timeout": timedelta(minutes=8)},
        notify_kwargs={"execution_timeout": timedelta(minutes=1), "retries": 3},
        # A `spark_connect` connection: write on a warm Spark Connect server; None: a Spark driver in the task.
        spark_conn_id=os.environ.get("EXACTLY_ONCE_DEMO_K2K_SPARK_CONN_ID"),
    )
    # [END kafka_to_kafka]
