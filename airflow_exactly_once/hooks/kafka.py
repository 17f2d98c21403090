"""Kafka settings from the official `kafka` connection type (apache-airflow-providers-apache-kafka).

Its extra holds librdkafka properties ("bootstrap.servers", "security.protocol",
"sasl.mechanism", "sasl.username", "sasl.password", "ssl.ca.location", ...), as the official
provider hands them to confluent-kafka; core.kafka_settings translates them for every client.
"""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.compat import BaseHook
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.kafka_settings import KafkaSettings


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
