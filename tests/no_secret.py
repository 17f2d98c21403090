"""The secrets of tests/system/test_no_secret_at_rest.py: the places a user can give one, and the Variables and
environment through which tests/dags/eo_no_secret_test_dag.py takes them.

Light on purpose (no Airflow, no random values at import): the DAG file imports the names, while the markers
themselves are made once per test session by tests/conftest.py and reach the test's Airflow in its environment
(`AIRFLOW_VAR_*`: Variables that exist in no database and no audit log).
"""

from __future__ import annotations

import uuid

PLACES = ("kafka-conn-sasl-password", "kafka-config-ssl-key-password", "sink-url-password",
          "dead-letter-url-password", "iceberg-catalog-url-password", "iceberg-catalog-s3-secret-access-key",
          "ledger-conn-password", "spark-connect-token", "spark-conf-s3a-secret-key", "registry-conn-password",
          # the `aws` connection of a Parquet sink on object storage: its password and extra aws_session_token
          "aws-conn-secret-access-key", "aws-conn-session-token",
          # an Iceberg REST catalog's connection: the OAuth2 client secret (its password), and the bearer token the
          # catalog's gateway hands out for it (never given by the user: every request of both clients carries it)
          "rest-conn-client-secret", "rest-catalog-token")
# Variable names without "secret", "password", "token", ...: Airflow masks none of their values by itself.
SINK_URL_VAR, DEAD_LETTER_URL_VAR, CATALOG_URL_VAR, CATALOG_S3_VAR, KAFKA_CONFIG_VAR = (
    "eo_nst_sink_url", "eo_nst_dead_letter_url", "eo_nst_catalog_url", "eo_nst_catalog_s3", "eo_nst_kafka_tls")
SPARK_CONF_ENV = "EO_NO_SECRET_SPARK_CONF"  # spark_conf is not templated: the DAG reads it when parsed


def new_markers() -> dict[str, str]:
    """A distinct secret per place, e.g. SECRET-sink-url-password-<32 hex digits>."""
    return {place: f"SECRET-{place}-{uuid.uuid4().hex}" for place in PLACES}


def pg_url(port: int, database: str, password: str) -> str:
    return f"postgresql://postgres:{password}@127.0.0.1:{port}/{database}"


def airflow_env(markers: dict[str, str], pg_port: int, pg_database: str) -> dict[str, str]:
    """The test Airflow's environment that carries the Variables and the spark_conf entry."""
    variables = {SINK_URL_VAR: pg_url(pg_port, pg_database, markers["sink-url-password"]),
                 DEAD_LETTER_URL_VAR: pg_url(pg_port, pg_database, markers["dead-letter-url-password"]),
                 CATALOG_URL_VAR: pg_url(pg_port, pg_database, markers["iceberg-catalog-url-password"]),
                 CATALOG_S3_VAR: markers["iceberg-catalog-s3-secret-access-key"],
                 KAFKA_CONFIG_VAR: markers["kafka-config-ssl-key-password"]}
    return {SPARK_CONF_ENV: markers["spark-conf-s3a-secret-key"],
            **{f"AIRFLOW_VAR_{name.upper()}": value for name, value in variables.items()}}
