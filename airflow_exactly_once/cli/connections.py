"""Which ledger and which Kafka a CLI command works on: the options that say it, and what they resolve to (stderr
says which ledger it is, without its password; Airflow's connections are read only when an option names one)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.ledger import redacted_url
from airflow_exactly_once.core.secrets import REDACTED
from airflow_exactly_once.kafka.settings import KafkaSettings

LEDGER_URL_ENV = "AIRFLOW_EXACTLY_ONCE_LEDGER_URL"


def ledger_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """Where the ledger is, and the output format: before the command, or (suppress=True) after it."""
    default: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--ledger-url", help="SQLAlchemy URL of the ledger, e.g. postgresql+psycopg2://u@h/db",
                       **default)
    where.add_argument("--ledger-conn-id", help="an Airflow connection (exactly_once_ledger, postgres or sqlite) "
                                                "holding the ledger", **default)
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables", **default)


def kafka_options(parser: argparse.ArgumentParser) -> None:
    """Which Kafka a command asks, when it is not the one the ledger stored (or its secrets are needed)."""
    parser.add_argument("--bootstrap-servers", help="Kafka to ask (default: the pipeline's own)")
    parser.add_argument("--kafka-conn-id", help="the kafka connection to ask with (needed when the pipeline's "
                                                "Kafka settings hold secrets, which the ledger does not store)")


def ledger_url(args: argparse.Namespace) -> str:
    """The ledger's URL; says on stderr which ledger it is (without its password), and when it is the embedded file
    that the pipelines' tasks refuse (their executor may run them on other machines, each with its own file)."""
    if args.ledger_url:
        return _reading(args.ledger_url, "--ledger-url")
    if args.ledger_conn_id or not os.environ.get(LEDGER_URL_ENV):
        from airflow_exactly_once.hooks.ledger import (
            LedgerHook,  # Airflow only when asked for
        )

        hook = LedgerHook(ledger_conn_id=args.ledger_conn_id)
        print(f"ledger: {hook.describe()}", file=sys.stderr)
        problem = hook.placement_problem()
        if problem:
            print(f"warning: this may not be the pipelines' ledger: their tasks refuse it: {problem} Read theirs "
                  f"with --ledger-conn-id or --ledger-url.", file=sys.stderr)
        return hook.get_url()
    return _reading(os.environ[LEDGER_URL_ENV], f"${LEDGER_URL_ENV}")


def _reading(url: str, origin: str) -> str:
    print(f"ledger: {redacted_url(url)} ({origin})", file=sys.stderr)
    return url


def kafka_settings(config: PipelineConfig | None, args: argparse.Namespace) -> KafkaSettings:
    """The pipeline's Kafka settings from the ledger (its secrets from the kafka connection its tasks used, as the
    ledger page takes them), or from --kafka-conn-id; --bootstrap-servers on top (alone without a pipeline)."""
    if args.kafka_conn_id:
        from airflow_exactly_once.hooks.kafka import (
            connection_kafka_settings,  # Airflow only when asked for
        )

        settings = connection_kafka_settings(args.kafka_conn_id)
    elif config is None:
        settings = KafkaSettings("")
    else:
        settings = KafkaSettings.of(config)
        if REDACTED in settings.properties.values():
            from airflow_exactly_once.hooks.kafka import (
                stored_pipeline_kafka_settings,  # Airflow only when the secrets are needed
            )

            settings = stored_pipeline_kafka_settings(config)
    if args.bootstrap_servers:
        settings = dataclasses.replace(settings, bootstrap_servers=args.bootstrap_servers,
                                       origin="--bootstrap-servers")
    return settings
