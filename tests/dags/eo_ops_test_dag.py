"""DAGs for the operations tests (startup modes, partitions, data loss, rewinds, interval backfills).

`eo_ops_continuation`: schedule=None, one micro-batch per triggered run, everything from params.
`eo_ops_interval`: hourly data intervals and range_mode="interval", driven by Airflow backfills.
(In Airflow 3 a plain cron string such as "@hourly" triggers at points in time with empty
data intervals; CronDataIntervalTimetable gives each run the hour before it.)
Its end_date lies in the past, so the scheduler never starts runs of its own in the test
stack: only backfills (POST /api/v2/backfills, what the UI's backfill dialog calls) and
explicit triggers do.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG
from airflow.timetables.interval import CronDataIntervalTimetable

from airflow_exactly_once.task_group import exactly_once_batch

COMMON = dict(
    start_date=datetime(2024, 1, 1),
    render_template_as_native_obj=True,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},
    tags=["exactly-once", "test"],
)
PIPELINE = dict(  # the same pipeline arguments, from each run's conf
    pipeline_id="{{ params.pipeline_id }}",
    topics="{{ params.topic }}",
    sink={"type": "parquet", "path": "{{ params.output }}"},
    transform="eo_test_transforms:rows",
    bootstrap_servers="{{ params.bootstrap_servers }}",
    spark_conn_id="{{ params.spark_conn_id }}",  # "": the write starts its own Spark driver
)

with DAG(
    dag_id="eo_ops_continuation",
    schedule=None,
    catchup=False,
    max_active_runs=1,
    params={
        "pipeline_id": "ops", "topic": "ops", "output": "/tmp/eo-ops-output", "bootstrap_servers": "",
        "spark_conn_id": "",
        "startup_mode": "earliest", "startup_timestamp": None, "data_loss_policy": "fail",
    },
    **COMMON,
):
    exactly_once_batch(
        **PIPELINE,
        startup_mode="{{ params.startup_mode }}",
        startup_timestamp="{{ params.startup_timestamp }}",
        data_loss_policy="{{ params.data_loss_policy }}",
    )

with DAG(
    dag_id="eo_ops_interval",
    schedule=CronDataIntervalTimetable("@hourly", timezone="UTC"),
    catchup=False,
    end_date=datetime(2024, 1, 2),
    max_active_runs=3,
    params={"pipeline_id": "ops-interval", "topic": "ops-interval", "output": "/tmp/eo-ops-interval",
            "bootstrap_servers": "", "spark_conn_id": "", "interval_rerun": "noop"},
    **COMMON,
):
    exactly_once_batch(
        **PIPELINE,
        range_mode="interval",
        interval_rerun="{{ params.interval_rerun }}",
    )
