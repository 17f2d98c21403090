"""The exactly-once test pipelines with their write on a Spark Connect server.

The tests create the `eo_spark_connect` connection (type spark_connect, through the REST API
as the UI would) once the session's server is up; each run names its own pipeline, topic
and output in the run conf. `eo_connect_test_held` holds its executors inside the write
(tests/dags/eo_cluster_transforms.py) so that a test can kill the task mid-write;
`eo_connect_test_timeout` holds them too, and its write times out after 10 s without a retry (Airflow
then calls the operator's on_kill).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch

SPARK_CONN_ID = "eo_spark_connect"

HELD = "eo_cluster_transforms:held_rows"
TIMED_OUT_WRITE = {"execution_timeout": timedelta(seconds=10), "retries": 0}

for dag_id, transform, write_kwargs in (("eo_connect_test", "eo_test_transforms:rows", {}),
                                        ("eo_connect_test_held", HELD, {}),
                                        ("eo_connect_test_timeout", HELD, TIMED_OUT_WRITE)):
    with DAG(
        dag_id=dag_id,
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
            transform=transform,
            max_records_per_partition="{{ params.max_records }}",
            spark_conn_id=SPARK_CONN_ID,
            write_kwargs=write_kwargs,
            # A failed notify_complete is retried after 20 s: time enough to restart the server meanwhile.
            notify_kwargs={"retry_delay": timedelta(seconds=20)},
        )
