"""Pipelines with bad records for the tests: JSON values, a guarded transform, dead letters.

`eo_bad_records_parquet` writes Parquet (dead letters in `<output>/_dead_letter`),
`eo_bad_records_kafka` writes a Kafka topic (dead letters to another topic).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch

COMMON = dict(schedule=None, start_date=datetime(2024, 1, 1), catchup=False, max_active_runs=1,
              render_template_as_native_obj=True, default_args={"retries": 2, "retry_delay": timedelta(seconds=1)})
DECODING = dict(value_format="json", value_schema="id BIGINT, amount BIGINT", bad_record_policy="dead_letter")

with DAG(dag_id="eo_bad_records_parquet", params={"pipeline_id": "test", "topic": "test", "output": "/tmp/eo",
                                                  "max_records": 100, "spark_conn_id": ""}, **COMMON):
    exactly_once_batch(
        pipeline_id="{{ params.pipeline_id }}",
        topics="{{ params.topic }}",
        sink={"type": "parquet", "path": "{{ params.output }}"},
        transform="eo_test_transforms:guarded_share",
        max_records_per_partition="{{ params.max_records }}",
        spark_conn_id="{{ params.spark_conn_id }}",  # "": the write starts its own Spark driver
        **DECODING,
    )

with DAG(dag_id="eo_bad_records_kafka", params={"pipeline_id": "test", "topic": "test", "output_topic": "test-out",
                                                "dead_letter_topic": "test-dlq", "max_records": 100,
                                                "spark_conn_id": ""}, **COMMON):
    exactly_once_batch(
        pipeline_id="{{ params.pipeline_id }}",
        topics="{{ params.topic }}",
        sink={"type": "kafka", "topic": "{{ params.output_topic }}", "transaction_timeout_ms": 120_000},
        dead_letter={"type": "kafka", "topic": "{{ params.dead_letter_topic }}"},
        transform="eo_test_transforms:guarded_share_as_value",
        max_records_per_partition="{{ params.max_records }}",
        spark_conn_id="{{ params.spark_conn_id }}",  # "": the write starts its own Spark driver
        **DECODING,
    )
