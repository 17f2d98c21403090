"""The Test button of Airflow's connection form (and `airflow connections test`) on the provider's connection types.

The ledger's test runs against real SQLite files and a port of this machine that nothing listens on; the
registry's runs against the real registry (tests/integration/test_schema_registry_formats.py)."""

from __future__ import annotations

import json

import sqlalchemy as sa

from airflow_exactly_once.airflow_integration.compat import BaseHook
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.ledger.versioning import VERSION_TABLE
from airflow_exactly_once.hooks.ledger import LedgerHook
from devtools.ports import reserve_port


def test_the_ledger_test_reads_the_schema_version_and_writes_nothing(tmp_path):
    path = tmp_path / "ledger.db"
    url = f"sqlite:///{path}"
    ok, message = LedgerHook(ledger_url=url).test_connection()
    assert ok and "not made yet" in message and not path.exists()  # the test made no file
    Ledger(url).create_schema()
    ok, message = LedgerHook(ledger_url=url).test_connection()
    assert ok and message.endswith("up to date"), message
    with sa.create_engine(url).begin() as conn:
        conn.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = 'f00d'")
    ok, message = LedgerHook(ledger_url=url).test_connection()
    assert not ok and "which this provider does not know" in message and "upgrade the provider" in message


def test_the_ledger_test_says_an_unreachable_server_and_hides_the_password():
    url = f"postgresql+psycopg2://ledger:s3cret@127.0.0.1:{reserve_port()}/ledger?connect_timeout=2"
    ok, message = LedgerHook(ledger_url=url).test_connection()
    assert not ok and "cannot be read" in message and "OperationalError" in message
    assert "s3cret" not in message and "***" in message


def test_airflows_connection_test_finds_the_ledger_hook(tmp_path, monkeypatch):
    """What the UI's Test button calls: Connection.test_connection, through the hook the connection type names."""
    path = tmp_path / "ledger.db"
    Ledger(f"sqlite:///{path}").create_schema()
    monkeypatch.setenv("AIRFLOW_CONN_LEDGER_UNDER_TEST", json.dumps(
        {"conn_type": "exactly_once_ledger", "host": str(path), "extra": {"backend": "sqlite"}}))
    ok, message = BaseHook.get_connection("ledger_under_test").test_connection()
    assert ok and "up to date" in message, message
