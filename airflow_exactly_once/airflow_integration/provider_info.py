"""What Airflow's ProvidersManager learns about this package (`airflow providers list`, the UI).

Read by the `apache_airflow_provider` entry point, so it imports neither Airflow nor the
package's other modules: listing providers must stay cheap and must work even where an
optional extra is missing. The ledger connection's UI metadata lives here, as plain data,
and the hook (airflow_exactly_once.hooks.ledger) reads the same dicts for Airflow releases
that ask the hook instead of the provider info (before 3.2).
"""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.version import __version__

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

REGISTRY_CONN_TYPE = "schema_registry"
REGISTRY_HOOK = "airflow_exactly_once.hooks.schema_registry.SchemaRegistryHook"
# The `schema_registry` connection: Host is the registry URL; Login/Password basic auth (a Password alone: a bearer
# token); the extra holds TLS files and other confluent-kafka SchemaRegistryClient settings.
REGISTRY_UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": ["schema"],
    "relabeling": {"host": "Registry URL", "password": "Password (or bearer token, without Login)"},
    "placeholders": {
        "host": "https://registry.example.com:8081",
        "login": "basic auth user (empty for a bearer token)",
        "extra": '{"ssl.ca.location": "/etc/ssl/registry-ca.pem", "ssl.certificate.location": "/etc/ssl/client.pem", '
                 '"ssl.key.location": "/etc/ssl/client.key"}',
    },
}

HOOK_MODULES = [
    "airflow_exactly_once.hooks.kafka",
    "airflow_exactly_once.hooks.ledger",
    "airflow_exactly_once.hooks.schema_registry",
    "airflow_exactly_once.hooks.spark_connect",
    "airflow_exactly_once.hooks.spark_submit",  # needs the [spark-submit] extra
]
OPERATOR_MODULES = [
    "airflow_exactly_once.operators.arguments",
    "airflow_exactly_once.operators.base",
    "airflow_exactly_once.operators.batch",
    "airflow_exactly_once.operators.write_launch",
    "airflow_exactly_once.operators.txn_guardrail",
]
# Airflow >= 3.2 adds these to its own CLI (`airflow exactly-once ...`); older releases ignore the key.
CLI_COMMANDS = ["airflow_exactly_once.cli.definition.get_cli_commands"]
TRIGGER_MODULES = ["airflow_exactly_once.triggers.backlog"]
# The ledger page (a FastAPI app and a UI entry). Also the `airflow.plugins` entry point in setup.cfg:
# Airflow 3.1 loads providers' plugins only with lazy_discover_providers off, entry points always.
PLUGIN = {"name": "exactly_once", "plugin-class": "airflow_exactly_once.ui.plugin.ExactlyOncePlugin"}
# [exactly_once] in airflow.cfg (AIRFLOW__EXACTLY_ONCE__...): what the ledger page reads, and whether the tasks may
# use the embedded ledger where they may run on several machines.
CONFIG_SECTION = "exactly_once"
EMBEDDED_LEDGER_SHARED = "embedded_ledger_shared"
CONFIG: dict[str, Any] = {
    CONFIG_SECTION: {
        "description": "The ledger page (Browse -> Exactly-once ledger) of airflow-exactly-once, and where its "
                       "tasks may use the embedded ledger.",
        "options": {
            "ledger_conn_id": {
                "description": "The connection of the offset ledger the page shows (the one the pipelines' "
                               "ledger_conn_id names). Default: the embedded SQLite file in AIRFLOW_HOME.",
                "version_added": "0.1.0", "type": "string", "example": "exactly_once_ledger_default",
                "default": None,
            },
            "ledger_url": {
                "description": "A SQLAlchemy URL of the ledger, instead of ledger_conn_id.",
                "version_added": "0.1.0", "type": "string",
                "example": "postgresql+psycopg2://reader@db:5432/ledger", "default": None,
            },
            "kafka_timeout_ms": {
                "description": "How long the page waits for Kafka's offsets before it shows the lag as unknown.",
                "version_added": "0.1.0", "type": "integer", "example": "5000", "default": "5000",
            },
            EMBEDDED_LEDGER_SHARED: {
                "description": "True: every worker opens the same embedded ledger file (its AIRFLOW_HOME is one "
                               "folder they share, with working file locks), so the tasks of pipelines without "
                               "ledger_conn_id / ledger_url may use it under an executor that runs tasks on several "
                               "machines (Celery, Kubernetes, ...). Otherwise they refuse it there: each worker "
                               "would keep its own ledger and write records again.",
                "version_added": "0.1.0", "type": "boolean", "example": "True", "default": "False",
            },
        },
    },
}


def get_provider_info() -> dict[str, Any]:
    """Provider metadata in the layout of the official providers' get_provider_info.py."""
    return {
        "package-name": "airflow-exactly-once",
        "name": "Exactly-once Kafka micro-batches",
        "description": "Kafka -> PySpark -> transactional sink (Parquet, PostgreSQL, Kafka, Iceberg), exactly once, "
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
            },
            {
                "connection-type": REGISTRY_CONN_TYPE,
                "hook-class-name": REGISTRY_HOOK,
                "hook-name": "Schema Registry (Confluent-compatible)",
                "ui-field-behaviour": REGISTRY_UI_FIELD_BEHAVIOUR,
            },
        ],
        "triggers": [{"integration-name": INTEGRATION, "python-modules": list(TRIGGER_MODULES)}],
        "plugins": [dict(PLUGIN)],
        "config": CONFIG,
        "cli": list(CLI_COMMANDS),
    }
