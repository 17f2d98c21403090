"""Example: Kafka topic -> transform -> Parquet, exactly once, with the write on a Spark cluster.

The same pipeline as kafka_to_parquet, except that the write task spark-submits the
package's job to the cluster of the `spark_default` connection (SparkSubmitHook of
apache-airflow-providers-apache-spark) and the executors read Kafka and write the files.
What changes for the DAG author:
  * `spark_conn_id`: an Airflow `spark` connection (host spark://master, port 7077,
    extra {"deploy-mode": "client"}; YARN or Kubernetes masters work the same way);
  * the transform is a "module:function" string, because it runs in another process;
  * the output path must be storage that the Airflow worker (driver) and every executor
    mount at the same path, as the commit is a rename there.
Also the system test of the cluster path (tests/system/test_pipeline_spark_cluster.py) and the
pipeline of the docker/ stack; settings come from the environment for their sake.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch

OUTPUT = os.environ.get(
    "EXACTLY_ONCE_SPARK_DEMO_OUTPUT",
    str(Path(os.environ.get("AIRFLOW_HOME", Path.home() / "airflow")) / "exactly_once_output"
        / "kafka_to_parquet_on_spark"),
)

with DAG(
    dag_id="kafka_to_parquet_on_spark",
    description="Kafka -> Parquet, exactly once, written by a Spark cluster",
    schedule=None,  # e.g. "*/5 * * * *": every run is one micro-batch
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 3, "retry_delay": timedelta(seconds=5)},
    tags=["exactly-once", "example", "spark-cluster"],
):
    # [START kafka_to_parquet_on_spark]
    exactly_once_batch(
        pipeline_id="kafka_to_parquet_on_spark",
        topics=[os.environ.get("EXACTLY_ONCE_SPARK_DEMO_TOPIC", "events")],
        kafka_conn_id="kafka_default",
        spark_conn_id="spark_default",
        spark_conf={"spark.executor.cores": "1", "spark.executor.memory": "512m", "spark.cores.max": "2"},
        ledger_conn_id=os.environ.get("EXACTLY_ONCE_LEDGER_CONN_ID"),  # unset: the embedded SQLite ledger
        sink={"type": "parquet", "path": OUTPUT},
        value_format="json",
        value_schema="id BIGINT, name STRING, amount DOUBLE",
        transform="example_transforms:select_events",  # dags/example_transforms.py
        max_records_per_partition=int(os.environ.get("EXACTLY_ONCE_DEMO_MAX_RECORDS", "1000")),
    )
    # [END kafka_to_parquet_on_spark]
