"""The Kafka example's pipeline (dags/kafka_to_kafka.py: Kafka -> Kafka, one transaction per Spark partition left open
by write, committed by notify_complete) routed to Celery queues, for tests/system/test_celery_workers.py.

Each task goes where `plan_kwargs` / `write_kwargs` / `notify_kwargs` / `abort_kwargs` send it: plan to worker A's own
queue, notify_complete to worker B's, write and abort to the queue both serve, so a write whose worker dies is
retried on the other. Every task reads the ledger from a PostgreSQL connection, as it must under Celery. Under the
session's LocalExecutor the queues mean nothing (the DAG only parses there).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch

DAG_ID = "eo_celery_k2k"
LEDGER_CONN_ID = "eo_celery_ledger"
# Worker A serves PLAN_QUEUE and SHARED_QUEUE, worker B NOTIFY_QUEUE and SHARED_QUEUE.
PLAN_QUEUE, NOTIFY_QUEUE, SHARED_QUEUE = "worker_a", "worker_b", "any_worker"

with DAG(
    dag_id=DAG_ID,
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=2)},
):
    exactly_once_batch(
        pipeline_id=os.environ.get("EO_CELERY_PIPELINE", DAG_ID),
        topics=[os.environ.get("EO_CELERY_INPUT", "celery_events")],
        ledger_conn_id=LEDGER_CONN_ID,
        sink={"type": "kafka", "topic": os.environ.get("EO_CELERY_OUTPUT", "celery_events_out"),
              "transaction_timeout_ms": 900_000, "producer_config": {"linger.ms": 20}},
        transform="eo_kafka_transforms:upper_value",
        max_records_per_partition=1000,
        spark_conn_id=os.environ.get("EO_CELERY_SPARK_CONN_ID"),
        plan_kwargs={"queue": PLAN_QUEUE},
        write_kwargs={"queue": SHARED_QUEUE, "execution_timeout": timedelta(minutes=8)},
        notify_kwargs={"queue": NOTIFY_QUEUE, "execution_timeout": timedelta(minutes=1), "retries": 3},
        abort_kwargs={"queue": SHARED_QUEUE},
    )
