"""What Airflow's ProvidersManager learns about this package (`airflow providers list`, the UI).

Read by the `apache_airflow_provider` entry point, so it imports neither Airflow nor the
package's other modules: listing providers must stay cheap and must work even where an
optional extra is missing. The ledger connection's UI metadata lives here, as plain data,
and the hook (airflow_exactly_once.hooks.ledger) reads the same dicts for Airflow releases
that ask the hook instead of the provider info (before 3.2).
"""

from __future__ import annotations

from typing import Any

INTEGRATION = "Exactly-once micro-batches"
LEDGER_CONN_TYPE = "exactly_once_ledger"
LEDGER_HOOK = "airflow_exactly_once.hooks.ledger.LedgerHook"

# The `exactly_once_ledger` connection: Host holds a full SQLAlchemy URL, or the server's
# host name with the usual port/login/password/schema fields and the `backend` extra.
LEDGER_UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": [],
    "relabeling": {"host": "Host or SQLAlchemy URL", "schema": "Database"},
    "placeholders": {
        "host": "db.example.com, or postgresql+psycopg2://user@db:5432/ledger, or sqlite:////var/lib/ledger.db",
        "port": "5432",
        "schema": "postgres",
        "login": "airflow",
        "extra": '{"backend": "postgresql", "sslmode": "require"}',
        "backend": "postgresql",
    },
}
LEDGER_CONN_FIELDS: dict[str, Any] = {
    "backend": {
        "label": "Backend",
        "description": "postgresql (default) or sqlite (Host is then the database file). "
                       "Ignored when Host holds a full SQLAlchemy URL.",
        "schema": {"type": ["string", "null"], "enum": ["postgresql", "sqlite", None]},
    },
}

HOOK_MODULES = [
    "airflow_exactly_once.hooks.kafka",
    "airflow_exactly_once.hooks.ledger",
    "airflow_exactly_once.hooks.spark_connect",
    "airflow_exactly_once.hooks.spark_submit",  # needs the [spark-submit] extra
]
OPERATOR_MODULES = [
    "airflow_exactly_once.operators.arguments",
    "airflow_exactly_once.operators.batch",
    "airflow_exactly_once.operators.cluster",
    "airflow_exactly_once.operators.txn_guardrail",
]
# Airflow >= 3.2 adds these to its own CLI (`airflow exactly-once ...`); older releases ignore the key.
CLI_COMMANDS = ["airflow_exactly_once.cli.definition.get_cli_commands"]


def get_provider_info() -> dict[str, Any]:
    """Provider metadata in the layout of the official providers' get_provider_info.py."""
    from airflow_exactly_once import __version__

    return {
        "package-name": "airflow-exactly-once",
        "name": "Exactly-once Kafka micro-batches",
        "description": "Kafka -> PySpark -> transactional sink (Parquet, PostgreSQL, Kafka), exactly once, "
                       "as a two-phase commit on Airflow task states (plan, write, notify_complete, abort).",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://spark.apache.org/docs/latest/structured-streaming-kafka-integration.html",
                "tags": ["apache"],
            }
        ],
        "operators": [{"integration-name": INTEGRATION, "python-modules": list(OPERATOR_MODULES)}],
        "hooks": [{"integration-name": INTEGRATION, "python-modules": list(HOOK_MODULES)}],
        "connection-types": [
            {
                "connection-type": LEDGER_CONN_TYPE,
                "hook-class-name": LEDGER_HOOK,
                "hook-name": "Exactly-once offset ledger",
                # Airflow >= 3.2 reads these instead of calling the hook's (deprecated) methods.
                "ui-field-behaviour": LEDGER_UI_FIELD_BEHAVIOUR,
                "conn-fields": LEDGER_CONN_FIELDS,
            }
        ],
        "cli": list(CLI_COMMANDS),
    }
