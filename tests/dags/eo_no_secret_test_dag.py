"""Two pipelines given a secret in every place a user can give one, for tests/system/test_no_secret_at_rest.py.

Neither this file nor a run's conf holds a secret (both are stored by Airflow as they are): the
secrets come at run time from the test's Airflow connections and from Variables whose names
Airflow does not take for secret ones (so only the provider can mask their values; set in the test
Airflow's environment, tests/no_secret.py), and `spark_conf`, which is not templated, from that
environment when the file is parsed.

* `pg` (the embedded ledger): Avro records in the Schema Registry wire format from the secured broker
  (connection `eo_nst_kafka`, SASL password in its extra) plus a secret in `kafka_config`, decoded through
  the Schema Registry connection `eo_nst_registry` (basic auth with a password), into a PostgreSQL sink and
  a PostgreSQL dead-letter table, both given as a `url` with a password;
* `ice` (a PostgreSQL ledger through connection `eo_nst_ledger`, which has a password): the same
  records (their bytes) into Iceberg, whose PostgreSQL catalog is given as a `url` with a password and a
  secret property;
* `s3`: the same records into Parquet on object storage (the test's s3proxy), through the `aws` connection
  `eo_nst_aws` (its password, the secret access key, and a session token in its extra);
* `rest`: the same records into Iceberg through a REST catalog, reached through connection `eo_nst_rest`
  (login and password: the OAuth2 client credential, exchanged by both clients for the gateway's token).

Both writes run on the Spark Connect server named by the run's `spark_conn_id`: the session's warm
server, or a connection with a token that points at a port nobody listens on (the failing run).
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.openlineage.utils.selective_enable import enable_lineage
from airflow.sdk import DAG

from airflow_exactly_once.task_group import exactly_once_batch
from tests.no_secret import (
    CATALOG_S3_VAR,
    CATALOG_URL_VAR,
    DEAD_LETTER_URL_VAR,
    KAFKA_CONFIG_VAR,
    SINK_URL_VAR,
    SPARK_CONF_ENV,
)

KAFKA_CONN_ID = "eo_nst_kafka"
LEDGER_CONN_ID = "eo_nst_ledger"
REGISTRY_CONN_ID = "eo_nst_registry"
AWS_CONN_ID = "eo_nst_aws"
REST_CONN_ID = "eo_nst_rest"

COMMON = dict(
    topics="{{ params.topic }}",
    kafka_conn_id=KAFKA_CONN_ID,
    # ssl.key.password goes unused without a client certificate: a secret that every client is handed.
    kafka_config={"ssl.key.password": "{{ var.value.%s }}" % KAFKA_CONFIG_VAR},
    max_records_per_partition="{{ params.max_records }}",
    spark_conn_id="{{ params.spark_conn_id }}",
    spark_conf={"spark.hadoop.fs.s3a.secret.key": os.environ.get(SPARK_CONF_ENV, "unset")},
)

with DAG(
    dag_id="eo_no_secret_test",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    render_template_as_native_obj=True,
    params={"prefix": "nst", "topic": "sec-in-nst", "table": "nst", "warehouse": "/tmp/eo-nst-lake",
            "bucket": "eo-nst", "max_records": 100, "spark_conn_id": ""},
    default_args={"retries": 0},  # the failing run fails at once; its error is the one the test searches
) as dag:
    exactly_once_batch(
        group_id="pg",
        pipeline_id="{{ params.prefix }}-pg",
        sink={"type": "postgres", "url": "{{ var.value.%s }}" % SINK_URL_VAR, "table": "{{ params.table }}"},
        value_format="avro",  # the wire format: the reader schema is the subject <topic>-value's latest
        schema_registry_conn_id=REGISTRY_CONN_ID,
        bad_record_policy="dead_letter",
        dead_letter={"type": "postgres", "url": "{{ var.value.%s }}" % DEAD_LETTER_URL_VAR,
                     "table": "{{ params.table }}_dead_letter"},
        transform="eo_test_transforms:guarded_share",
        **COMMON,
    )
    exactly_once_batch(
        group_id="ice",
        pipeline_id="{{ params.prefix }}-ice",
        sink={"type": "iceberg", "table": "db.{{ params.table }}", "warehouse": "{{ params.warehouse }}",
              # s3.* properties go unused with a local warehouse: a secret that pyiceberg and Spark are handed.
              "catalog": {"type": "postgres", "url": "{{ var.value.%s }}" % CATALOG_URL_VAR,
                          "properties": {"s3.secret-access-key": "{{ var.value.%s }}" % CATALOG_S3_VAR}},
              "create_table": True},
        ledger_conn_id=LEDGER_CONN_ID,
        transform="eo_test_transforms:rows",
        **COMMON,
    )
    exactly_once_batch(
        group_id="s3",
        pipeline_id="{{ params.prefix }}-s3",
        sink={"type": "parquet", "path": "s3://{{ params.bucket }}/{{ params.prefix }}", "aws_conn_id": AWS_CONN_ID},
        transform="eo_test_transforms:rows",
        **COMMON,
    )
    exactly_once_batch(
        group_id="rest",
        pipeline_id="{{ params.prefix }}-rest",
        # its own catalog name: the warm Spark Connect server may keep `ice`'s catalog (named iceberg) loaded
        sink={"type": "iceberg", "table": "db.{{ params.table }}", "create_table": True,
              "catalog": {"type": "rest", "name": "nst_rest", "conn_id": REST_CONN_ID}},
        transform="eo_test_transforms:rows",
        **COMMON,
    )
enable_lineage(dag)  # its tasks' OpenLineage events are searched too
