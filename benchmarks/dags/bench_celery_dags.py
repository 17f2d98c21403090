"""The DAGs of benchmarks/bench_celery_dag_run.py: one small Kafka -> Kafka batch written on the warm Spark Connect
server, on the LocalExecutor and on two Celery workers (the stack runs both executors: `[core] executor =
LocalExecutor,CeleryExecutor`). The Celery DAG's tasks are routed as a platform would: plan and notify_complete to
worker A's queue, write to worker B's, so every hand-over between tasks crosses workers."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch

CELERY_ROUTES = {"plan_kwargs": {"queue": "bench_a"}, "write_kwargs": {"queue": "bench_b"},
                 "notify_kwargs": {"queue": "bench_a"}, "abort_kwargs": {"queue": "bench_b"}}

for name, executor, routes in (("bench_on_local", "LocalExecutor", {}),
                               ("bench_on_celery", "CeleryExecutor", CELERY_ROUTES)):
    with DAG(name, schedule=None, start_date=datetime(2024, 1, 1), catchup=False, max_active_runs=1,
             default_args={"executor": executor}):
        exactly_once_batch(
            pipeline_id=name,
            topics=[os.environ.get("BENCH_TOPIC", "bench")],
            sink={"type": "kafka", "topic": f"{os.environ.get('BENCH_TOPIC', 'bench')}-{name}"},
            transform="bench_transforms:key_value",
            ledger_conn_id="bench_ledger",
            spark_conn_id="bench_spark_connect",
            **routes,
        )
