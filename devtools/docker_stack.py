"""docker/docker-compose.yml, generated from the settings the tests run with.

The broker properties come from LocalKafkaBroker, the PostgreSQL settings from
LocalPostgres, the worker size from LocalSparkCluster and Airflow's scheduler settings
from AirflowStack; only what must differ in containers (host names, ports, paths) is
replaced. `python -m devtools docker-compose --write` rewrites the file,
and a test fails when the committed file and this module disagree.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from devtools.kafka_broker import LocalKafkaBroker
from devtools.maven import KAFKA_VERSION
from devtools.postgres import LocalPostgres
from devtools.schema_registry import apicurio_version
from devtools.spark_cluster import DAEMON_MEMORY, WORKER_CORES, WORKER_MEMORY
from devtools.spark_connect import server_command, server_conf

COMPOSE_FILE = Path(__file__).resolve().parents[1] / "docker" / "docker-compose.yml"
IMAGE = "airflow-exactly-once:dev"
BUILD = {"context": "..", "dockerfile": "docker/Dockerfile"}  # on every service of the image: built once
KAFKA_IMAGE = f"apache/kafka:{KAFKA_VERSION}"
POSTGRES_IMAGE = "postgres:15"  # the major version of Debian's package that the tests use
POSTGRES_PASSWORD = "exactly-once"  # a local demo stack: change it for anything else
KAFKA_CLUSTER_ID = "ZXhhY3RseS1vbmNlLWRlbW8"
SPARK_MASTER = "spark://spark-master:7077"
SPARK_CONNECT_PORT = 15002
DATA = "/data"  # mounted by the Airflow worker (the Spark driver) and every Spark worker
ICEBERG_CATALOG_CONN = "iceberg_catalog"  # dags/kafka_to_iceberg.py's catalog
ICEBERG_CATALOG_DATABASE = "iceberg_catalog"
# The tests' Schema Registry (Apicurio, devtools/schema_registry.py) as its project publishes it, storing its schemas
# in a database of the stack's PostgreSQL: a restart keeps every schema id that records in Kafka refer to.
SCHEMA_REGISTRY_IMAGE = f"apicurio/apicurio-registry-sql:{apicurio_version()}"
SCHEMA_REGISTRY_DATABASE = "schema_registry"
SCHEMA_REGISTRY_URL = "http://schema-registry:8080/apis/ccompat/v7"  # Confluent's REST API, as the tests use it
SINK_DATABASE = "exactly_once"  # dags/kafka_to_postgres.py: its table and its ledger, beside the other pipelines'

# Host-specific broker properties: everything else is the tests' broker, unchanged.
KAFKA_CONTAINER_PROPERTIES = {
    "listeners": "PLAINTEXT://:9092,CONTROLLER://:9093,HOST://:29092",
    "advertised.listeners": "PLAINTEXT://kafka:9092,HOST://localhost:29092",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,HOST:PLAINTEXT",
    "controller.quorum.voters": "1@kafka:9093",
    "log.dirs": "/var/lib/kafka/data",
}
# Server settings that only locate the tests' server (or log to a file) stay out.
POSTGRES_HOST_SETTINGS = ("listen_addresses", "port", "unix_socket_directories", "logging_collector")
# Airflow settings of the tests' stack that carry over as they are.
AIRFLOW_SHARED_SETTINGS = (
    "AIRFLOW__CORE__LOAD_EXAMPLES", "AIRFLOW__CORE__EXECUTOR", "AIRFLOW__CORE__PARALLELISM",
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION", "AIRFLOW__CORE__AUTH_MANAGER",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "AIRFLOW__API__WORKERS", "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY", "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL",
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL", "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_SEC", "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT",
    "AIRFLOW__LOGGING__LOGGING_LEVEL", "PYTHONUNBUFFERED",
)


def kafka_env_name(key: str) -> str:
    """apache/kafka's image turns KAFKA_A_B into property a.b (a literal '_' would be '__')."""
    return "KAFKA_" + key.replace("_", "__").replace(".", "_").upper()


def kafka_properties() -> dict[str, str]:
    """The tests' broker properties, with the container's listeners and paths."""
    properties = LocalKafkaBroker("/unused", port=9092, controller_port=9093)._config()
    properties.update(KAFKA_CONTAINER_PROPERTIES)
    return properties


def postgres_settings() -> dict[str, str]:
    settings = LocalPostgres("/unused", port=5432)._config()
    return {k: v.strip("'") for k, v in settings.items() if k not in POSTGRES_HOST_SETTINGS}


def airflow_settings() -> dict[str, str]:
    from devtools.airflow_stack import AirflowStack

    env = AirflowStack("/unused", []).env()
    return {key: env[key] for key in AIRFLOW_SHARED_SETTINGS}


def _airflow_environment() -> dict[str, str]:
    db = f"postgresql+psycopg2://postgres:{POSTGRES_PASSWORD}@postgres:5432"
    return {
        **airflow_settings(),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"{db}/airflow",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://airflow-api-server:8080/execution/",
        "AIRFLOW__API__BASE_URL": "http://localhost:8080",
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka",
                                                  "extra": {"bootstrap.servers": "kafka:9092"}}),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "spark://spark-master",
                                                  "port": 7077, "extra": {"deploy-mode": "client"}}),
        "AIRFLOW_CONN_SPARK_CONNECT_DEFAULT": json.dumps({"conn_type": "spark_connect", "host": "spark-connect",
                                                          "port": SPARK_CONNECT_PORT}),
        "AIRFLOW_CONN_EXACTLY_ONCE_LEDGER": json.dumps({
            "conn_type": "postgres", "host": "postgres", "port": 5432, "login": "postgres",
            "password": POSTGRES_PASSWORD, "schema": "exactly_once"}),
        "EXACTLY_ONCE_LEDGER_CONN_ID": "exactly_once_ledger",
        # dags/kafka_to_postgres.py's sink and ledger (its default EXACTLY_ONCE_DEMO_POSTGRES_CONN).
        "AIRFLOW_CONN_POSTGRES_DEFAULT": json.dumps({
            "conn_type": "postgres", "host": "postgres", "port": 5432, "login": "postgres",
            "password": POSTGRES_PASSWORD, "schema": SINK_DATABASE}),
        # dags/kafka_to_parquet_registry.py's registry: the schema-registry service.
        "AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT": json.dumps({"conn_type": "schema_registry",
                                                            "host": SCHEMA_REGISTRY_URL}),
        # The Iceberg sink's production catalog: Iceberg's JDBC catalog in its own database (postgres-init.sql).
        f"AIRFLOW_CONN_{ICEBERG_CATALOG_CONN.upper()}": json.dumps({
            "conn_type": "postgres", "host": "postgres", "port": 5432, "login": "postgres",
            "password": POSTGRES_PASSWORD, "schema": ICEBERG_CATALOG_DATABASE}),
        "EXACTLY_ONCE_DEMO_ICEBERG_CATALOG_CONN": ICEBERG_CATALOG_CONN,
        "EXACTLY_ONCE_DEMO_ICEBERG_WAREHOUSE": f"{DATA}/lakehouse",
        # The ledger page reads the pipelines' ledger (each container has its own AIRFLOW_HOME, so not the
        # embedded file); the event-driven example and its trigger share it too.
        "AIRFLOW__EXACTLY_ONCE__LEDGER_CONN_ID": "exactly_once_ledger",
        "EXACTLY_ONCE_ARRIVAL_OUTPUT": f"{DATA}/arrivals",
        "EXACTLY_ONCE_DEMO_OUTPUT": f"{DATA}/kafka_to_parquet",
        "EXACTLY_ONCE_SPARK_DEMO_OUTPUT": f"{DATA}/kafka_to_parquet_on_spark",
    }


def _airflow_service(command: str, shared: dict[str, Any], **extra: Any) -> dict[str, Any]:
    service = {
        "image": IMAGE,
        "build": BUILD,
        "command": command,
        "environment": shared["environment"],  # the same objects: written once, then as YAML aliases
        "volumes": shared["volumes"],
        "depends_on": {"airflow-init": {"condition": "service_completed_successfully"}},
        "restart": "unless-stopped",
    }
    service.update(extra)
    return service


def _spark_service(command: list[str], **extra: Any) -> dict[str, Any]:
    service = {
        "image": IMAGE,
        "build": BUILD,
        # The image's entrypoint runs `airflow <command>` unless the command is bash or python.
        "command": ["bash", "-c", "exec spark-class " + " ".join(command)],
        "environment": {"SPARK_DAEMON_MEMORY": DAEMON_MEMORY},
        "restart": "unless-stopped",
    }
    service.update(extra)
    return service


def spark_connect_command() -> list[str]:
    """The tests' Spark Connect server (devtools/spark_connect.py), listening on every address of its container;
    the image's spark-defaults.conf lists the Kafka connector jars."""
    conf = server_conf(SPARK_CONNECT_PORT, "0.0.0.0", "/tmp/spark-connect", jars=[])
    return server_command("spark-submit", WORKER_CORES, conf)


def compose_spec() -> dict[str, Any]:
    shared = {"environment": _airflow_environment(),
              "volumes": ["../dags:/opt/airflow/dags:ro", f"exactly-once-data:{DATA}"]}
    postgres_command = ["postgres"] + [arg for k, v in postgres_settings().items() for arg in ("-c", f"{k}={v}")]
    return {  # no top-level `name`: Debian's docker-compose 1.29 does not know it
        "services": {
            "kafka": {
                "image": KAFKA_IMAGE,
                "hostname": "kafka",
                "environment": {"CLUSTER_ID": KAFKA_CLUSTER_ID,
                                **{kafka_env_name(k): v for k, v in kafka_properties().items()}},
                "ports": ["29092:29092"],
                "volumes": ["kafka-data:/var/lib/kafka/data"],
                "healthcheck": {"test": ["CMD-SHELL", "/opt/kafka/bin/kafka-broker-api-versions.sh "
                                         "--bootstrap-server localhost:9092 > /dev/null"],
                                "interval": "10s", "retries": 12},
            },
            "postgres": {
                "image": POSTGRES_IMAGE,
                "command": postgres_command,
                "environment": {"POSTGRES_PASSWORD": POSTGRES_PASSWORD},
                "volumes": ["./postgres-init.sql:/docker-entrypoint-initdb.d/10-databases.sql:ro",
                            "postgres-data:/var/lib/postgresql/data"],
                "healthcheck": {"test": ["CMD", "pg_isready", "-U", "postgres"], "interval": "5s", "retries": 12},
            },
            "spark-master": _spark_service(
                ["org.apache.spark.deploy.master.Master", "--host", "spark-master", "--port", "7077",
                 "--webui-port", "8080"],
                hostname="spark-master", ports=["8081:8080"]),
            "spark-worker": _spark_service(
                ["org.apache.spark.deploy.worker.Worker", "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY,
                 "--work-dir", "/opt/spark-work", SPARK_MASTER],
                depends_on=["spark-master"], volumes=[f"exactly-once-data:{DATA}"]),
            # Write tasks with spark_conn_id="spark_connect_default" run their job here (no driver per task).
            # It writes the sinks' output, so it mounts the data volume the Airflow tasks publish in.
            "spark-connect": {
                "image": IMAGE,
                "build": BUILD,
                "command": ["bash", "-c", "exec " + shlex.join(spark_connect_command())],
                "hostname": "spark-connect",
                "ports": [f"{SPARK_CONNECT_PORT}:{SPARK_CONNECT_PORT}"],
                "volumes": [f"exactly-once-data:{DATA}"],
                "depends_on": ["kafka"],
                "restart": "unless-stopped",
            },
            # Topics in the Schema Registry wire format (value_format="avro", ...) read their writer schemas here.
            "schema-registry": {
                "image": SCHEMA_REGISTRY_IMAGE,
                "hostname": "schema-registry",
                "environment": {
                    "REGISTRY_DATASOURCE_URL": f"jdbc:postgresql://postgres:5432/{SCHEMA_REGISTRY_DATABASE}",
                    "REGISTRY_DATASOURCE_USERNAME": "postgres", "REGISTRY_DATASOURCE_PASSWORD": POSTGRES_PASSWORD},
                "ports": ["8082:8080"],
                "depends_on": {"postgres": {"condition": "service_healthy"}},
                "restart": "unless-stopped",
            },
            "airflow-init": {
                **_airflow_service("db migrate", shared, restart="no"),
                "depends_on": {"postgres": {"condition": "service_healthy"}},
            },
            "airflow-api-server": _airflow_service("api-server", shared, hostname="airflow-api-server", ports=["8080:8080"]),
            "airflow-scheduler": _airflow_service(
                "scheduler", shared, hostname="airflow-scheduler",
                depends_on={"airflow-init": {"condition": "service_completed_successfully"},
                            "kafka": {"condition": "service_healthy"}, "spark-worker": {"condition": "service_started"}}),
            "airflow-dag-processor": _airflow_service("dag-processor", shared),
            # Asset watchers (dags/kafka_to_parquet_on_arrival.py: runs when records arrive) need a triggerer.
            "airflow-triggerer": _airflow_service("triggerer", shared),
        },
        "volumes": {"kafka-data": {}, "postgres-data": {}, "exactly-once-data": {}},
    }


HEADER = """\
# Kafka (KRaft) + Spark standalone (master, worker) + a Spark Connect server + PostgreSQL + a Schema Registry
# (Apicurio, Confluent's API) + Airflow with airflow-exactly-once. GENERATED from the settings the tests use; do not edit by hand. Change devtools/ and run
#   python -m devtools docker-compose --write
# Usage: see "Trying it with Docker" in docs/cluster.md (docker compose -f docker/docker-compose.yml up).
"""


def render() -> str:
    import yaml

    class Dumper(yaml.SafeDumper):
        """Objects used by several services are written once, under an anchor named for them."""

        def generate_anchor(self, node: yaml.Node) -> str:
            text = str(node.value)
            for name, marker in (("airflow-environment", "AIRFLOW__CORE__EXECUTOR"), ("image-build", "context"),
                                 ("airflow-volumes", "/opt/airflow/dags")):
                if marker in text:
                    return name
            return super().generate_anchor(node)

    return HEADER + yaml.dump(compose_spec(), Dumper=Dumper, sort_keys=False, width=120, default_flow_style=False)


def write(path: Path = COMPOSE_FILE) -> Path:
    path.write_text(render())
    return path
