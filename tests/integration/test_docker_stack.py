"""docker/: the compose file is the tests' own stack in containers, and a compose client accepts it.

There is no Docker engine here, so the stack is not started; what can be checked without one
is: the committed file is what the devenv code generates, its services carry the settings
the tests run with (read back the way the images read them), and `docker compose config`
(or Debian's docker-compose) validates it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess

import pytest
import yaml

from devtools import docker_stack
from devtools.airflow_stack import AirflowStack
from devtools.kafka_broker import LocalKafkaBroker
from devtools.maven import KAFKA_VERSION
from devtools.postgres import LocalPostgres
from devtools.schema_registry import apicurio_version
from devtools.spark_cluster import DAEMON_MEMORY, WORKER_CORES, WORKER_MEMORY
from devtools.spark_connect import LocalSparkConnectServer

COMPOSE = docker_stack.COMPOSE_FILE


@pytest.fixture(scope="module")
def services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_committed_compose_file_is_the_generated_one():
    assert COMPOSE.read_text() == docker_stack.render(), (
        "docker/docker-compose.yml differs from the settings the tests use; run "
        "`python -m devtools docker-compose --write` and commit the result")


def _property_of(env_name: str) -> str:
    """Inverse of apache/kafka's mapping: '___' -> '-', '__' -> '_', '_' -> '.'."""
    name = env_name.removeprefix("KAFKA_").lower()
    return name.replace("___", "\0").replace("__", "\1").replace("_", ".").replace("\0", "-").replace("\1", "_")


def test_kafka_service_runs_the_tests_broker(services, tmp_path):
    kafka = services["kafka"]
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"  # the release whose jars the tests run
    in_container = {_property_of(k): v for k, v in kafka["environment"].items() if k.startswith("KAFKA_")}
    tests_broker = LocalKafkaBroker(tmp_path, port=9092, controller_port=9093)._config()
    host_specific = set(docker_stack.KAFKA_CONTAINER_PROPERTIES)
    assert {k: v for k, v in in_container.items() if k not in host_specific} == {
        k: v for k, v in tests_broker.items() if k not in host_specific}
    assert in_container["transaction.state.log.replication.factor"] == "1"  # transactions on one node


def test_postgres_spark_and_airflow_services_use_the_tests_settings(services, tmp_path):
    command = services["postgres"]["command"]
    settings = dict(arg.split("=", 1) for arg in command[2::2])
    assert settings["max_prepared_transactions"] == str(LocalPostgres(tmp_path).max_prepared_transactions)
    assert int(settings["max_prepared_transactions"]) > 0  # two-phase commit of the PostgreSQL sink
    assert services["postgres"]["image"].startswith("postgres:")

    worker = " ".join(services["spark-worker"]["command"])
    assert f"--cores {WORKER_CORES} --memory {WORKER_MEMORY}" in worker and docker_stack.SPARK_MASTER in worker
    assert services["spark-master"]["environment"]["SPARK_DAEMON_MEMORY"] == DAEMON_MEMORY

    env = services["airflow-scheduler"]["environment"]
    stack_env = AirflowStack(tmp_path, []).env()
    assert {k: env[k] for k in docker_stack.AIRFLOW_SHARED_SETTINGS} == {
        k: stack_env[k] for k in docker_stack.AIRFLOW_SHARED_SETTINGS}
    spark = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert f"spark://spark-master:{spark['port']}" == docker_stack.SPARK_MASTER
    assert spark["extra"]["deploy-mode"] == "client"  # standalone runs Python drivers in client mode only
    # The Spark driver (scheduler's task) and the executors (worker) see the same output folder.
    assert f"exactly-once-data:{docker_stack.DATA}" in services["spark-worker"]["volumes"]
    assert f"exactly-once-data:{docker_stack.DATA}" in services["airflow-scheduler"]["volumes"]
    assert "../dags:/opt/airflow/dags:ro" in services["airflow-scheduler"]["volumes"]


def test_the_spark_connect_service_runs_the_tests_server(services, tmp_path):
    def settings(command: list[str]) -> dict[str, str]:
        return dict(value.split("=", 1) for flag, value in zip(command, command[1:]) if flag == "--conf")

    conf = settings(shlex.split(services["spark-connect"]["command"][2].removeprefix("exec ")))
    tests_server = settings(LocalSparkConnectServer(tmp_path, port=15002)._command())
    host_specific = {"spark.connect.grpc.binding.address", "spark.local.dir", "spark.jars"}
    assert {k: v for k, v in conf.items() if k not in host_specific} == {
        k: v for k, v in tests_server.items() if k not in host_specific}
    assert conf["spark.connect.grpc.binding.address"] == "0.0.0.0"  # reachable from the Airflow containers
    assert f"exactly-once-data:{docker_stack.DATA}" in services["spark-connect"]["volumes"]  # it writes the output
    connect = json.loads(services["airflow-scheduler"]["environment"]["AIRFLOW_CONN_SPARK_CONNECT_DEFAULT"])
    assert (connect["conn_type"], connect["host"], connect["port"]) == ("spark_connect", "spark-connect", 15002)


def test_a_compose_client_accepts_the_file():
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        cmd = ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"]
    elif shutil.which("docker-compose"):
        cmd = ["docker-compose", "-f", str(COMPOSE), "config", "--quiet"]
    else:
        raise AssertionError("no compose client: install Docker's compose plugin or Debian's docker-compose "
                             "(`make setup` does)")
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} rejected the file:\n{result.stdout}{result.stderr}"


def test_the_iceberg_example_gets_its_catalog_database(services):
    env = services["airflow-scheduler"]["environment"]
    conn = json.loads(env[f"AIRFLOW_CONN_{docker_stack.ICEBERG_CATALOG_CONN.upper()}"])
    assert conn["conn_type"] == "postgres" and conn["host"] == "postgres"
    assert f"CREATE DATABASE {conn['schema']};" in (COMPOSE.parent / "postgres-init.sql").read_text()
    assert env["EXACTLY_ONCE_DEMO_ICEBERG_CATALOG_CONN"] == docker_stack.ICEBERG_CATALOG_CONN
    assert env["EXACTLY_ONCE_DEMO_ICEBERG_WAREHOUSE"].startswith(docker_stack.DATA)


def test_the_registry_service_runs_the_tests_registry_on_its_own_database(services):
    registry = services["schema-registry"]
    assert registry["image"] == f"apicurio/apicurio-registry-sql:{apicurio_version()}"  # the tests' release
    database = registry["environment"]["REGISTRY_DATASOURCE_URL"].rsplit("/", 1)[1]
    assert f"CREATE DATABASE {database};" in (COMPOSE.parent / "postgres-init.sql").read_text()
    conn = json.loads(services["airflow-scheduler"]["environment"]["AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"])
    assert conn["host"].startswith("http://schema-registry:8080/apis/ccompat/")  # Confluent's API of Apicurio
