"""docker/ agrees with itself: what the mounted example DAGs ask for, the image installs and the compose file defines.

The compose file mounts all of dags/ into the Airflow containers, so every example DAG is parsed and may be
triggered there. Read statically (no Airflow stack, no Docker engine): each DAG file's calls, with the values its
module-level names and `os.environ.get(...)` take under the compose file's environment, give the connection ids it
names (with the provider's own defaults, e.g. kafka_default, where a call leaves them out) and what it needs
installed (a registry format, a PostgreSQL sink or ledger, Iceberg, a Spark cluster or Spark Connect server, an
Airflow provider it imports); setup.cfg says which extra brings each, docker/Dockerfile which extras the image
installs. tests/integration/test_docker_stack.py checks the compose file against its generator.
"""

from __future__ import annotations

import ast
import configparser
import inspect
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from airflow_exactly_once.airflow_integration.provider_info import LEDGER_CONN_TYPE, REGISTRY_CONN_TYPE
from airflow_exactly_once.core.config import REGISTRY_FORMATS
from airflow_exactly_once.operators import arguments

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DAG_FILES = sorted((ROOT / "dags").glob("*.py"))
UNKNOWN = object()  # a value this reading cannot work out (a computed path, a number)

# What each connection role must be, and the extra a connection of that type needs.
ROLE_CONN_TYPES = {
    "kafka_conn_id": {"kafka"},
    "schema_registry_conn_id": {REGISTRY_CONN_TYPE},
    "ledger_conn_id": {"postgres", LEDGER_CONN_TYPE, "sqlite"},
    "spark_conn_id": {"spark", "spark_connect"},
}
CONN_TYPE_EXTRAS = {"postgres": "postgres", "spark": "spark-submit", "spark_connect": "spark-connect"}
SINK_TYPE_EXTRAS = {"postgres": "postgres", "iceberg": "iceberg"}


def compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def airflow_services() -> dict[str, dict[str, Any]]:
    """The services that mount dags/: where the example DAGs are parsed and run."""
    return {name: service for name, service in compose()["services"].items()
            if any(str(volume).endswith(":/opt/airflow/dags:ro") for volume in service.get("volumes", []))}


def compose_environment() -> dict[str, str]:
    environments = [service["environment"] for service in airflow_services().values()]
    assert environments and all(env == environments[0] for env in environments), \
        "the Airflow services of docker-compose.yml must share one environment"
    return {key: str(value) for key, value in environments[0].items()}


def compose_connections() -> dict[str, dict[str, Any]]:
    """The connections the compose file defines, by id (Airflow reads AIRFLOW_CONN_<ID> as JSON)."""
    return {key.removeprefix("AIRFLOW_CONN_").lower(): json.loads(value)
            for key, value in compose_environment().items() if key.startswith("AIRFLOW_CONN_")}


def setup_extras() -> dict[str, list[str]]:
    """setup.cfg's extras: name -> the distribution names they install."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return {extra: [re.split(r"[\[<>=!~ ;]", line.strip(), maxsplit=1)[0].lower()
                    for line in lines.splitlines() if line.strip() and not line.strip().startswith("#")]
            for extra, lines in parser["options.extras_require"].items()}


def image_extras() -> set[str]:
    """The extras docker/Dockerfile installs the provider with (`.../src[a,b,...]`)."""
    found = re.findall(r"/opt/airflow-exactly-once/src\[([^\]]*)\]", (DOCKER / "Dockerfile").read_text())
    assert len(found) == 1, "docker/Dockerfile should install the provider once, with its extras"
    return {extra.strip() for extra in found[0].split(",") if extra.strip()}


class DagReading:
    """One DAG file, read with the values its names take under an environment."""

    def __init__(self, path: Path, env: dict[str, str]) -> None:
        self.path = path
        self.env = env
        self.tree = ast.parse(path.read_text(), str(path))
        self.names = {target.id: node.value for node in self.tree.body if isinstance(node, ast.Assign)
                      for target in node.targets if isinstance(target, ast.Name)}
        self.imported = {alias.asname or alias.name: f"{node.module}.{alias.name}" for node in ast.walk(self.tree)
                         if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}

    def value(self, node: ast.AST | None) -> Any:
        """What an expression evaluates to here, or UNKNOWN."""
        if node is None:
            return None
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.value(self.names[node.id]) if node.id in self.names else UNKNOWN
        if isinstance(node, ast.Dict):
            return {self.value(k): self.value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(element) for element in node.elts]
        if isinstance(node, ast.IfExp):
            test = self.value(node.test)
            return UNKNOWN if test is UNKNOWN else self.value(node.body if test else node.orelse)
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
            key = self.value(node.args[0])
            default = self.value(node.args[1]) if len(node.args) > 1 else None
            return self.env.get(key, default)
        return UNKNOWN

    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        """Every call of the file: the called name and its keyword arguments' values."""
        return [(ast.unparse(node.func), {kw.arg: self.value(kw.value) for kw in node.keywords if kw.arg})
                for node in ast.walk(self.tree) if isinstance(node, ast.Call)]

    def provider_defaults(self, func: str) -> dict[str, Any]:
        """The connection ids the provider uses when a call of `func` leaves them out."""
        origin = self.imported.get(func, "")
        if not origin.startswith("airflow_exactly_once."):
            return {}
        if origin.endswith(".exactly_once_batch") or origin.startswith("airflow_exactly_once.operators."):
            return {a.name: a.default for a in arguments.ARGUMENTS if a.name.endswith("conn_id")}
        module, _, name = origin.rpartition(".")
        target = getattr(__import__(module, fromlist=[name]), name)
        return {p.name: p.default for p in inspect.signature(target).parameters.values()
                if p.name.endswith("conn_id") and p.default is not inspect.Parameter.empty}

    def connection_uses(self) -> list[tuple[str, str]]:
        """(role, connection id) of every connection the file names or leaves to the provider's default."""
        uses: list[tuple[str, str]] = []
        for func, kwargs in self.calls():
            for role, conn_id in {**self.provider_defaults(func), **kwargs}.items():
                if role.endswith("conn_id") and isinstance(conn_id, str):
                    uses.append((role, conn_id))
            for spec in (kwargs.get("sink"), kwargs.get("dead_letter")):
                uses += [("conn_id", conn_id) for conn_id in _conn_ids_in(spec)]
        return uses

    def extras_needed(self, connections: dict[str, dict[str, Any]]) -> dict[str, str]:
        """extra -> why this DAG needs it."""
        needed: dict[str, str] = {}
        for _func, kwargs in self.calls():
            formats = {kwargs.get("value_format"), kwargs.get("key_format")} & set(REGISTRY_FORMATS)
            if formats or isinstance(kwargs.get("schema_registry_conn_id"), str):
                needed["schema-registry"] = f"value/key format {sorted(map(str, formats))} or a schema_registry_conn_id"
            for spec in (kwargs.get("sink"), kwargs.get("dead_letter")):
                if isinstance(spec, dict) and spec.get("type") in SINK_TYPE_EXTRAS:
                    needed[SINK_TYPE_EXTRAS[spec["type"]]] = f"a {spec['type']} sink"
            for role in ("ledger_conn_id", "spark_conn_id"):
                conn_type = connections.get(kwargs.get(role) or "", {}).get("conn_type")
                if conn_type in CONN_TYPE_EXTRAS:
                    needed[CONN_TYPE_EXTRAS[conn_type]] = f"{role}: a {conn_type} connection"
            if str(kwargs.get("ledger_url") or "").startswith("postgres"):
                needed["postgres"] = "a PostgreSQL ledger_url"
        by_distribution = {dist: extra for extra, dists in setup_extras().items() if extra != "test" for dist in dists}
        for node in ast.walk(self.tree):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for module in modules:
                if module.startswith("airflow.providers."):
                    dist = "apache-airflow-providers-" + module.split(".")[2].replace("_", "-")
                    if dist in by_distribution:
                        needed[by_distribution[dist]] = f"imports {module}"
        return needed


def _conn_ids_in(value: Any) -> list[str]:
    """The `conn_id`s of a sink spec, its catalog included."""
    if isinstance(value, dict):
        own = [value["conn_id"]] if isinstance(value.get("conn_id"), str) else []
        return own + [found for item in value.values() for found in _conn_ids_in(item)]
    return []


@pytest.fixture(scope="module")
def readings() -> list[DagReading]:
    env = compose_environment()
    return [DagReading(path, env) for path in DAG_FILES]


def test_the_image_installs_every_extra_a_mounted_dag_needs(readings):
    connections = compose_connections()
    missing = {f"{reading.path.name}: {extra} ({why})" for reading in readings
               for extra, why in reading.extras_needed(connections).items() if extra not in image_extras()}
    assert not missing, f"docker/Dockerfile leaves out extras the mounted DAGs need: {sorted(missing)}"


def test_the_image_installs_every_runtime_extra():
    """The docker/ stack is where a user tries every feature: lineage too, which the OpenLineage provider turns on
    by being installed (no DAG names it). Not the repository's own tooling: `test`, and `benchmarks` (the figures)."""
    assert image_extras() == set(setup_extras()) - {"test", "benchmarks"}


def test_every_connection_a_mounted_dag_names_is_defined_with_its_type(readings):
    connections = compose_connections()
    undefined, mistyped = set(), set()
    for reading in readings:
        for role, conn_id in reading.connection_uses():
            if conn_id not in connections:
                undefined.add(f"{reading.path.name}: {role}={conn_id!r}")
            elif connections[conn_id]["conn_type"] not in ROLE_CONN_TYPES.get(role, {"postgres"}):
                mistyped.add(f"{reading.path.name}: {role}={conn_id!r} is a {connections[conn_id]['conn_type']}")
    assert not undefined, f"docker/docker-compose.yml defines no AIRFLOW_CONN_* for: {sorted(undefined)}"
    assert not mistyped, f"connections of the wrong type: {sorted(mistyped)}"


def test_the_reading_finds_what_the_examples_ask_for(readings):
    """The reading itself: the registry example's connection and extra, a provider default, an env-driven id."""
    by_name = {reading.path.name: reading for reading in readings}
    registry = by_name["kafka_to_parquet_registry.py"]
    assert ("schema_registry_conn_id", "schema_registry_default") in registry.connection_uses()
    assert "schema-registry" in registry.extras_needed({})
    assert ("conn_id", "iceberg_catalog") in by_name["kafka_to_iceberg.py"].connection_uses()
    assert "iceberg" in by_name["kafka_to_iceberg.py"].extras_needed({})
    postgres = by_name["kafka_to_postgres.py"]
    assert {"postgres"} <= set(postgres.extras_needed({}))
    on_arrival = DagReading(ROOT / "dags" / "kafka_to_parquet_on_arrival.py", {"EXACTLY_ONCE_LEDGER_CONN_ID": "mine"})
    assert ("ledger_conn_id", "mine") in on_arrival.connection_uses()
    # A call that leaves kafka_conn_id out still uses the provider's default connection.
    hourly = DagReading(ROOT / "dags" / "kafka_to_parquet_hourly.py", {})
    assert all(conn_id == "kafka_default" for role, conn_id in hourly.connection_uses() if role == "kafka_conn_id")
    assert hourly.provider_defaults("exactly_once_batch")["kafka_conn_id"] == "kafka_default"


def test_every_connection_points_at_a_service_of_the_file():
    """A connection whose host is no service of the compose file reaches nothing inside the stack."""
    services = compose()["services"]
    names = set(services) | {service.get("hostname") for service in services.values()}
    for conn_id, conn in compose_connections().items():
        hosts = [conn["host"]] if conn.get("host") else []
        hosts += [server for server in str(conn.get("extra", {}).get("bootstrap.servers", "")).split(",") if server]
        assert hosts, f"connection {conn_id} names no host"
        for host in hosts:
            name = urlsplit(host if "://" in host else f"//{host}").hostname
            assert name in names, f"connection {conn_id}: {host!r} is no service of docker-compose.yml"
