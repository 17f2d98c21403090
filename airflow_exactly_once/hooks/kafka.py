"""Kafka settings from the official `kafka` connection type (apache-airflow-providers-apache-kafka)."""

from __future__ import annotations

from airflow_exactly_once.compat import BaseHook
from airflow_exactly_once.core.errors import ConfigurationError


def kafka_bootstrap_servers(kafka_conn_id: str) -> str:
    """bootstrap.servers of an official `kafka` connection (apache-kafka provider's layout)."""
    conn = BaseHook.get_connection(kafka_conn_id)
    extra = conn.extra_dejson
    servers = extra.get("bootstrap.servers") or extra.get("bootstrap_servers")
    if not servers and conn.host:
        servers = f"{conn.host}:{conn.port or 9092}"
    if not servers:
        raise ConfigurationError(
            f"connection {kafka_conn_id!r} has no bootstrap servers: set its extra to "
            '{"bootstrap.servers": "host:port"} or pass bootstrap_servers= to the operator')
    return servers
