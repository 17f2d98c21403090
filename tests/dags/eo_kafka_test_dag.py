"""Parametrised Kafka -> Kafka pipelines for the tests: each test triggers one with its own conf.

`eo_kafka_test` has sensible retries; `eo_kafka_test_long_retries` gives notify_complete a
retry schedule longer than the transaction timeout, which `plan` must refuse.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch

for dag_id, notify_kwargs in (
    ("eo_kafka_test", {}),
    ("eo_kafka_test_long_retries", {"retries": 5, "retry_delay": timedelta(minutes=3)}),
):
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=4,
        render_template_as_native_obj=True,
        params={
            "pipeline_id": "test",
            "topic": "test",
            "output_topic": "test-out",
            "max_records": 100,
            "guarantee": "EXACTLY_ONCE",
            "transaction_timeout_ms": 120_000,
            "spark_conn_id": "",  # "": the write starts its own Spark driver; a connection: it runs there
        },
        default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},
    ):
        exactly_once_batch(
            pipeline_id="{{ params.pipeline_id }}",
            topics="{{ params.topic }}",
            sink={"type": "kafka", "topic": "{{ params.output_topic }}",
                  "transaction_timeout_ms": "{{ params.transaction_timeout_ms }}"},
            guarantee="{{ params.guarantee }}",
            transform="eo_kafka_transforms:upper_value",
            max_records_per_partition="{{ params.max_records }}",
            spark_conn_id="{{ params.spark_conn_id }}",
            notify_kwargs=notify_kwargs,
        )
