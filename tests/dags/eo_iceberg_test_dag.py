"""A parametrised Kafka -> Iceberg pipeline for the tests: each test triggers it with its own conf
(its own table, warehouse and catalog)."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch

with DAG(
    dag_id="eo_iceberg_test",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=4,
    render_template_as_native_obj=True,
    params={"pipeline_id": "test", "topic": "test", "table": "db.test", "warehouse": "/tmp/lake",
            "catalog": {"type": "embedded"}, "max_records": 100,
            "spark_conn_id": ""},  # "": the write starts its own Spark driver; a connection: it runs there
    default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},
):
    exactly_once_batch(
        pipeline_id="{{ params.pipeline_id }}",
        topics="{{ params.topic }}",
        sink={"type": "iceberg", "table": "{{ params.table }}", "warehouse": "{{ params.warehouse }}",
              "catalog": "{{ params.catalog }}", "create_table": True},
        transform="eo_test_transforms:rows",
        max_records_per_partition="{{ params.max_records }}",
        spark_conn_id="{{ params.spark_conn_id }}",
    )
