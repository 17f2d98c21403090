"""The ledger page's api-server: a second api-server of the session's Airflow, with the FAB auth manager.

Same home, metadata database and embedded ledger as the session's stack (tests/conftest.py),
but the auth manager most deployments run: FAB, with users whose DAG grants differ, set up as
an operator does (tests/system/test_ui_page.py checks who sees which pipeline). The page reads
the ledger through the `exactly_once_ledger` connection UI_LEDGER_CONN, as pipelines do.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_exactly_once.hooks.ledger import EMBEDDED_LEDGER_FILE
from tests.dags.exactly_once_connect_test_dag import SPARK_CONN_ID

UI_LEDGER_CONN = "eo_ui_ledger"
FAB_AUTH_MANAGER = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
PASSWORDS = {"admin": "admin-pass", "alice": "alice-pass", "bob": "bob-pass"}
# alice may read kafka_to_parquet only; bob kafka_to_kafka and eo_ui_noop; admin (FAB's Admin role) every DAG.
DAG_ACCESS = {"alice": ["kafka_to_parquet"], "bob": ["kafka_to_kafka", "eo_ui_noop"]}


@dataclass
class LedgerUI:
    base_url: str
    ledger_url: str

    def token(self, user: str) -> str:
        from devtools.airflow_stack import login

        return login(self.base_url, user, PASSWORDS[user])


def _fab_api(base_url: str, token: str, method: str, path: str, body: Any = None) -> Any:
    """FAB's own REST API (/auth/fab/v1: what its Security pages call)."""
    request = urllib.request.Request(f"{base_url}/auth/fab/v1{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read().decode())


@pytest.fixture(scope="session")
def ledger_ui(airflow) -> LedgerUI:
    """The api-server, and FAB's users: admin (Admin) and a DAG-limited Viewer each for alice and bob.

    As a FAB deployment grants a DAG: FAB's tables (`airflow fab-db migrate`), a resource per DAG
    (`airflow sync-perm --include-dags`; a dag-processor running FAB does it as it parses), an admin
    (`airflow users create`), then, through FAB's API, one role per user: Viewer's permissions
    without `can_read` on `DAGs` (every DAG), with `can_read` on `DAG:<dag_id>` for each DAG granted
    and on `Plugins` (FAB's Viewer lacks it, and Airflow's UI lists plugin pages only with it).
    """
    ledger_url = f"sqlite:///{Path(airflow.home) / EMBEDDED_LEDGER_FILE}"
    airflow.put_connection(UI_LEDGER_CONN, {"conn_type": "exactly_once_ledger", "host": ledger_url})
    env = {
        "AIRFLOW__CORE__AUTH_MANAGER": FAB_AUTH_MANAGER,
        "AIRFLOW__EXACTLY_ONCE__LEDGER_CONN_ID": UI_LEDGER_CONN,
        "AIRFLOW__EXACTLY_ONCE__KAFKA_TIMEOUT_MS": "3000",
    }
    for dag_id in sorted({d for dags in DAG_ACCESS.values() for d in dags}):
        airflow.wait_for_dag(dag_id)
    airflow.cli(["fab-db", "migrate"], env)
    airflow.cli(["sync-perm", "--include-dags"], env)
    airflow.cli(["users", "create", "--username", "admin", "--password", PASSWORDS["admin"], "--role", "Admin",
                 "--firstname", "admin", "--lastname", "test", "--email", "admin@example.com"], env)
    base_url = airflow.start_api_server("api-server-ui", env)

    ui = LedgerUI(base_url, ledger_url)
    admin = ui.token("admin")
    viewer = _fab_api(base_url, admin, "GET", "/roles/Viewer")["actions"]
    every_dag = {"action": {"name": "can_read"}, "resource": {"name": "DAGs"}}
    assert every_dag in viewer, viewer  # what the roles below take away
    for user, dag_ids in DAG_ACCESS.items():
        grants = [{"action": {"name": "can_read"}, "resource": {"name": r}}
                  for r in [f"DAG:{d}" for d in dag_ids] + ["Plugins"]]
        _fab_api(base_url, admin, "POST", "/roles",
                 {"name": f"eo_{user}", "actions": [p for p in viewer if p != every_dag] + grants})
        _fab_api(base_url, admin, "POST", "/users", {
            "username": user, "password": PASSWORDS[user], "first_name": user, "last_name": "test",
            "email": f"{user}@example.com", "roles": [{"name": f"eo_{user}"}]})
    return ui


@pytest.fixture(scope="session")
def warm_spark(airflow, spark_connect) -> dict[str, str]:
    """DAG run conf that sends a test pipeline's write to the session's Spark Connect server.

    A write task that starts its own Spark driver spends 7 to 15 s on it (benchmarks/dag_run.py);
    on the warm server a DAG run takes a third of the time. Tests about the protocol (crash points,
    fencing, clears, backfills, startup modes) use it, and so do the Schema Registry, the Kafka and the
    event-driven example DAGs (by their environment); the other example DAGs and the tests about the in-task driver
    itself (its JVM killed, errors raised in it) keep the driver of their own.
    """
    airflow.put_connection(SPARK_CONN_ID, spark_connect.connection())
    return {"spark_conn_id": SPARK_CONN_ID}
