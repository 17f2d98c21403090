"""The DAGs of benchmarks/bench_dag_run.py: Airflow's own no-op DAG, and one small batch in-process and on Spark Connect."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, task

from airflow_exactly_once.task_group import exactly_once_batch

with DAG("bench_noop", schedule=None, start_date=datetime(2024, 1, 1), catchup=False):

    @task
    def first():
        return None

    @task
    def second():
        return None

    @task
    def third():
        return None

    first() >> second() >> third()

for name, spark_conn_id in (("bench_local", None), ("bench_connect", "bench_spark_connect")):
    with DAG(name, schedule=None, start_date=datetime(2024, 1, 1), catchup=False, max_active_runs=1):
        exactly_once_batch(
            pipeline_id=name,
            topics=[os.environ.get("BENCH_TOPIC", "bench")],
            sink={"type": "parquet", "path": os.path.join(os.environ.get("BENCH_OUTPUT", "/tmp/bench-out"), name)},
            transform="bench_transforms:rows",
            spark_conn_id=spark_conn_id,
        )
