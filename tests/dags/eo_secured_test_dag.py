"""Kafka -> Kafka through the secured broker: every Kafka setting comes from the `kafka` connection.

`kafka_conn_id` names the connection (AIRFLOW_CONN_KAFKA_SECURED in the test stack's environment,
a SASL_SSL/SCRAM-SHA-512 login with its CA); the DAG itself names no server, user or certificate.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch

with DAG(
    dag_id="eo_secured_test",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=2,
    render_template_as_native_obj=True,
    params={"pipeline_id": "sec-test", "topic": "sec-in-test", "output_topic": "sec-out-test",
            "kafka_conn_id": "kafka_secured"},
    default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},
):
    exactly_once_batch(
        pipeline_id="{{ params.pipeline_id }}",
        topics="{{ params.topic }}",
        sink={"type": "kafka", "topic": "{{ params.output_topic }}", "transaction_timeout_ms": 120_000},
        kafka_conn_id="{{ params.kafka_conn_id }}",
        transform="eo_kafka_transforms:upper_value",
    )
