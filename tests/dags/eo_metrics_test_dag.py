"""A pipeline whose metrics a test reads from a StatsD listener (tests/system/test_metrics_airflow.py).

Kafka in (JSON values, bad records to dead letters), Kafka out (a commit deadline: the transaction
timeout), its write on the session's warm Spark Connect server. The DAG is scheduled on the
pipeline's backlog Asset with a watcher that never fires (min_records out of reach): the test
triggers its one run itself, and the watcher only polls, sending the pipeline's lag metrics.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_exactly_once.airflow_integration.assets import pipeline_backlog_asset
from airflow_exactly_once.task_group import exactly_once_batch
from airflow_exactly_once.triggers.backlog import PipelineBacklogTrigger

PIPELINE = TOPIC = os.environ.get("EO_METRICS_PIPELINE", "eo_metrics")

watcher = PipelineBacklogTrigger(pipeline_id=PIPELINE, topics=[TOPIC], kafka_conn_id="kafka_default",
                                 min_records=10**12, poll_interval_seconds=2)

with DAG(dag_id="eo_metrics", schedule=[pipeline_backlog_asset(PIPELINE, watcher)], start_date=datetime(2024, 1, 1),
         catchup=False, max_active_runs=1, default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},
         tags=["exactly-once", "test"]):
    exactly_once_batch(
        pipeline_id=PIPELINE,
        topics=[TOPIC],
        kafka_conn_id="kafka_default",
        sink={"type": "kafka", "topic": f"{TOPIC}-out", "transaction_timeout_ms": 120_000},
        dead_letter={"type": "kafka", "topic": f"{TOPIC}-dlq", "transaction_timeout_ms": 180_000},
        transform="eo_test_transforms:guarded_share_as_value",
        value_format="json",
        value_schema="id BIGINT, amount BIGINT",
        bad_record_policy="dead_letter",
        max_records_per_partition=10,
        spark_conn_id=os.environ.get("EO_METRICS_SPARK_CONN_ID"),
    )
