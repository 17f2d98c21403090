"""Example: Kafka topic -> transform -> Parquet on object storage (S3 or an S3-compatible server), exactly once.

Each file of a batch is staged as an open multipart upload and published by completing it; a batch is
complete when its `_manifest/batch-<n>.json` exists (docs/sinks/parquet.md). The credentials come from an
Airflow connection of type `aws` (login = access key id, password = secret access key, extras
`endpoint_url` and `region_name` for a server that is not AWS): never from this file.

`make demo` runs it against its own s3proxy (connection `aws_default`, bucket `lake`); in your own DAG,
just write the values.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG
from example_transforms import EVENT_SCHEMA, select_events  # the DAG folder is on the Python path

from airflow_exactly_once.task_group import exactly_once_batch

# [START kafka_to_parquet_s3]
with DAG(
    dag_id="kafka_to_parquet_s3",
    description="Kafka -> Parquet on S3, exactly once",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 3, "retry_delay": timedelta(seconds=2)},
    tags=["exactly-once", "example"],
):
    exactly_once_batch(
        pipeline_id="kafka_to_parquet_s3",
        topics=[os.environ.get("EXACTLY_ONCE_DEMO_TOPIC", "events")],
        kafka_conn_id="kafka_default",
        sink={"type": "parquet", "path": os.environ.get("EXACTLY_ONCE_DEMO_S3_PATH", "s3://lake/kafka_to_parquet"),
              "aws_conn_id": "aws_default"},  # conn_type "aws"; extra {"endpoint_url": ..., "region_name": ...}
        value_format="json",
        value_schema=EVENT_SCHEMA,
        bad_record_policy="dead_letter",  # <path>/_dead_letter on the same bucket, committed with the batch
        transform=select_events,
        startup_mode="earliest",
        max_records_per_partition=int(os.environ.get("EXACTLY_ONCE_DEMO_S3_MAX_RECORDS", "100000")),
    )
# [END kafka_to_parquet_s3]
