"""airflow-exactly-once: exactly-once Kafka-to-sink micro-batches for Apache Airflow and PySpark."""

from __future__ import annotations

# The provider metadata (entry point `apache_airflow_provider`); it imports neither Airflow nor PySpark.
from airflow_exactly_once.airflow_integration.provider_info import get_provider_info
from airflow_exactly_once.version import __version__

__all__ = ["__version__", "get_provider_info"]
