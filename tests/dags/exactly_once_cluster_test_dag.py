"""The exactly-once test pipeline with its write spark-submitted to a standalone cluster.

The test creates the `eo_spark_cluster` connection (through the REST API, as the UI would)
once its cluster is up; each run names its own pipeline, topic and output in the run conf.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from devtools.spark_cluster import APP_CONF
from airflow_exactly_once.task_group import exactly_once_batch

SPARK_CONN_ID = "eo_spark_cluster"

with DAG(
    dag_id="eo_cluster_test_held",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=4,
    render_template_as_native_obj=True,
    params={"pipeline_id": "test", "topic": "test", "output": "/tmp/eo-test-output", "max_records": 100},
    default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},
):
    exactly_once_batch(
        pipeline_id="{{ params.pipeline_id }}",
        topics="{{ params.topic }}",
        sink={"type": "parquet", "path": "{{ params.output }}"},
        transform="eo_cluster_transforms:held_rows",
        max_records_per_partition="{{ params.max_records }}",
        spark_conn_id=SPARK_CONN_ID,
        spark_conf=APP_CONF,
    )
