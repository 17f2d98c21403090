"""airflow-exactly-once: exactly-once Kafka-to-sink micro-batches for Apache Airflow and PySpark."""

from __future__ import annotations

__version__ = "0.1.0"

# The provider metadata (entry point `apache_airflow_provider`); it imports neither Airflow nor PySpark.
from airflow_exactly_once.airflow_integration.provider_info import get_provider_info  # noqa: E402

__all__ = ["__version__", "get_provider_info"]
