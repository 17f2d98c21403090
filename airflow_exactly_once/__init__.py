"""airflow-exactly-once: exactly-once Kafka-to-sink micro-batches for Apache Airflow and PySpark."""

from __future__ import annotations

__version__ = "0.1.0"


def get_provider_info() -> dict:
    """Provider metadata read by Airflow's ProvidersManager (`airflow providers list`)."""
    return {
        "package-name": "airflow-exactly-once",
        "name": "Exactly-once Kafka micro-batches",
        "description": "Kafka -> PySpark -> transactional sink, exactly once, as a two-phase commit "
                       "on Airflow task states (plan, write, notify_complete, abort).",
        "versions": [__version__],
        "hook-class-names": [],
        "connection-types": [
            {"connection-type": "exactly_once_ledger",
             "hook-class-name": "airflow_exactly_once.hooks.ledger.LedgerHook"},
        ],
        "operators": [
            {"integration-name": "Exactly-once micro-batches",
             "python-modules": ["airflow_exactly_once.operators.batch"]},
        ],
        "hooks": [
            {"integration-name": "Exactly-once micro-batches",
             "python-modules": ["airflow_exactly_once.hooks.ledger"]},
        ],
    }
