"""The ledger page's api-server: a second api-server of the session's Airflow, with users whose DAG access differs.

Same home, metadata database and embedded ledger as the session's stack (tests/conftest.py);
its own auth manager configuration: SimpleAuthManager's users and login, and per-user DAG
grants (tests/system/dag_access.py) that SimpleAuthManager alone cannot express. The page
reads the ledger through the `exactly_once_ledger` connection UI_LEDGER_CONN, as pipelines do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_exactly_once.hooks.ledger import EMBEDDED_LEDGER_FILE
from tests.dags.exactly_once_connect_test_dag import SPARK_CONN_ID

UI_LEDGER_CONN = "eo_ui_ledger"
PASSWORDS = {"admin": "admin-pass", "alice": "alice-pass", "bob": "bob-pass"}
# alice may read kafka_to_parquet only; bob kafka_to_kafka and eo_ui_noop; admin (role admin) everything.
DAG_ACCESS = {"alice": ["kafka_to_parquet"], "bob": ["kafka_to_kafka", "eo_ui_noop"]}


@dataclass
class LedgerUI:
    base_url: str
    ledger_url: str

    def token(self, user: str) -> str:
        from devtools.airflow_stack import login

        return login(self.base_url, user, PASSWORDS[user])


@pytest.fixture(scope="session")
def ledger_ui(airflow, tmp_path_factory) -> LedgerUI:
    folder = tmp_path_factory.mktemp("ledger-ui")
    passwords = folder / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    ledger_url = f"sqlite:///{Path(airflow.home) / EMBEDDED_LEDGER_FILE}"
    airflow.put_connection(UI_LEDGER_CONN, {"conn_type": "exactly_once_ledger", "host": ledger_url})
    base_url = airflow.start_api_server("api-server-ui", {
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.system.dag_access.DagAccessAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,alice:viewer,bob:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "EO_TEST_DAG_ACCESS": json.dumps(DAG_ACCESS),
        "AIRFLOW__EXACTLY_ONCE__LEDGER_CONN_ID": UI_LEDGER_CONN,
        "AIRFLOW__EXACTLY_ONCE__KAFKA_TIMEOUT_MS": "3000",
    })
    return LedgerUI(base_url, ledger_url)


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
