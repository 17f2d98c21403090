"""Kafka settings from the official `kafka` connection type (apache-airflow-providers-apache-kafka).

Its extra holds librdkafka properties ("bootstrap.servers", "security.protocol",
"sasl.mechanism", "sasl.username", "sasl.password", "ssl.ca.location", ...), as the official
provider hands them to confluent-kafka; kafka.settings translates them for every client.
"""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.airflow_integration.compat import BaseHook
from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.secrets import REDACTED
from airflow_exactly_once.kafka.settings import KafkaSettings


def connection_kafka_settings(kafka_conn_id: str) -> KafkaSettings:
    """Everything the connection's extra says (host:port as servers when the extra names none)."""
    try:
        conn = BaseHook.get_connection(kafka_conn_id)
    except Exception as exc:
        raise ConfigurationError(
            f"the Kafka connection {kafka_conn_id!r} cannot be read ({exc}): create it (type kafka, extra "
            '{"bootstrap.servers": "host:port", ...}) or pass bootstrap_servers= to the operator') from exc
    origin = f"connection {kafka_conn_id!r}"
    settings = KafkaSettings.from_mapping(conn.extra_dejson, origin=origin)
    if not settings.bootstrap_servers and conn.host:
        settings = KafkaSettings(f"{conn.host}:{conn.port or 9092}", settings.properties, f"{origin} (host)")
    if not settings.bootstrap_servers:
        raise ConfigurationError(
            f"connection {kafka_conn_id!r} has no bootstrap servers: set its extra to "
            '{"bootstrap.servers": "host:port"} or pass bootstrap_servers= to the operator')
    return settings


def source_kafka_settings(kafka_conn_id: str | None, kafka_config: dict[str, Any] | None,
                          bootstrap_servers: str | None) -> KafkaSettings:
    """A pipeline's source cluster: the connection, then `kafka_config` over it, then `bootstrap_servers`.

    With `bootstrap_servers` given and the connection missing, the connection is not needed.
    """
    if bootstrap_servers and kafka_conn_id in (None, "", "kafka_default"):
        try:
            base = connection_kafka_settings(kafka_conn_id) if kafka_conn_id else KafkaSettings("")
        except ConfigurationError:
            base = KafkaSettings("")  # the default connection is optional when servers are given
    else:
        base = connection_kafka_settings(kafka_conn_id or "kafka_default")
    settings = base.merged(kafka_config)
    if bootstrap_servers:
        settings = KafkaSettings(bootstrap_servers, settings.properties, "bootstrap_servers")
    return settings.require_servers()


def stored_pipeline_kafka_settings(config: PipelineConfig) -> KafkaSettings:
    """A pipeline's source settings as the ledger stored them, secrets taken back from its `kafka` connection.

    The ledger keeps the servers and client properties with secrets replaced; readers of the
    ledger (the ledger page) fill them in from the connection the pipeline's tasks used.
    """
    settings = KafkaSettings.of(config).require_servers()
    redacted = sorted(k for k, v in settings.properties.items() if v == REDACTED)
    if not redacted:
        return settings
    if not config.kafka_conn_id:
        raise ConfigurationError(
            f"pipeline {config.pipeline_id!r} reads Kafka with secrets ({', '.join(redacted)}) that the ledger does "
            "not store and names no kafka connection to take them from: run it once with this release of "
            "airflow-exactly-once (its tasks record the connection id)")
    secrets = connection_kafka_settings(config.kafka_conn_id).secrets()
    missing = [k for k in redacted if k not in secrets]
    if missing:
        raise ConfigurationError(
            f"pipeline {config.pipeline_id!r}: {', '.join(missing)} came from the DAG's kafka_config, not from "
            f"connection {config.kafka_conn_id!r}, so no reader of the ledger can know it; keep secrets in the "
            "kafka connection's extra")
    return KafkaSettings(settings.bootstrap_servers, {**settings.properties, **{k: secrets[k] for k in redacted}},
                         settings.origin)
