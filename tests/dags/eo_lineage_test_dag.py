"""A pipeline whose OpenLineage events a test reads (tests/system/test_lineage_airflow.py).

Kafka in, Parquet out, its write on the session's warm Spark Connect server. Lineage is on for
this DAG only (the session's Airflow runs OpenLineage with selective_enable and a file transport):
`enable_lineage` is how a deployment turns it on for chosen DAGs. Each run names its pipeline,
topic and output in its conf; `eo_lineage_test_failing`'s transform raises, so its batch is aborted.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.openlineage.utils.selective_enable import enable_lineage
from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch
from tests.dags.exactly_once_connect_test_dag import SPARK_CONN_ID

for dag_id, transform in (("eo_lineage_test", "eo_test_transforms:rows"),
                          ("eo_lineage_test_failing", "eo_test_transforms:explode")):  # raises: the batch aborts
    with DAG(
        dag_id=dag_id,
        schedule=None,
        start_date=datetime(2024, 1, 1),
        catchup=False,
        max_active_runs=1,
        render_template_as_native_obj=True,
        params={"pipeline_id": "test", "topic": "test", "output": "/tmp/eo-test-output"},
        default_args={"retries": 2, "retry_delay": timedelta(seconds=1)},
    ) as dag:
        exactly_once_batch(
            pipeline_id="{{ params.pipeline_id }}",
            topics="{{ params.topic }}",
            sink={"type": "parquet", "path": "{{ params.output }}"},
            transform=transform,
            spark_conn_id=SPARK_CONN_ID,
        )
    enable_lineage(dag)
