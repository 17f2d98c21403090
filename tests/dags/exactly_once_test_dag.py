"""Parametrised exactly-once pipelines for the tests: each test triggers one with its own conf.

One DAG per transform (`eo_parquet_test` uses `rows`, `eo_parquet_test_<name>` uses `<name>`),
because a transform is code, not a templated value.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch

for transform in ("rows", "slow_rows", "kill_spark_once", "explode", "wrong_type"):
    with DAG(
        dag_id="eo_parquet_test" + ("" if transform == "rows" else f"_{transform}"),
        schedule=None,
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=4,
        render_template_as_native_obj=True,
        params={
            "pipeline_id": "test",
            "topic": "test",
            "output": "/tmp/eo-test-output",
            "max_records": 100,
            "local_read_max_records": 5000,  # 0: Spark's Kafka source reads every batch
            "bootstrap_servers": "",
            "spark_conn_id": "",  # "": the write starts its own Spark driver; a connection: it runs there
        },
        default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},
    ):
        exactly_once_batch(
            pipeline_id="{{ params.pipeline_id }}",
            topics="{{ params.topic }}",
            sink={"type": "parquet", "path": "{{ params.output }}"},
            transform=f"eo_test_transforms:{transform}",
            max_records_per_partition="{{ params.max_records }}",
            local_read_max_records="{{ params.local_read_max_records }}",
            bootstrap_servers="{{ params.bootstrap_servers }}",
            spark_conn_id="{{ params.spark_conn_id }}",
        )
