"""A pipeline's whole check: the protocol's rules, the Kafka client settings, the value format, the sinks'.

core.config declares every setting and checks what the protocol needs; what Kafka's clients, a
value schema and each sink accept is known in their own packages, and put together here. This
is also where the secrets of a config are found (`PipelineConfig.secret_paths`), so the ledger
never stores one.
"""

from __future__ import annotations

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.kafka.settings import KafkaSettings, secret_keys
from airflow_exactly_once.records.avro_schema import record_fields
from airflow_exactly_once.sinks import spec_secret_paths


def checked(config: PipelineConfig) -> PipelineConfig:
    """`config` validated by every rule, with its secrets located; raises ConfigurationError naming what to fix."""
    config.validate()
    KafkaSettings.of(config).require_servers().check()
    if config.value_format == "avro":
        record_fields(config.value_schema)
    config.secret_paths = secret_paths(config)
    return config


def secret_paths(config: PipelineConfig) -> list[list[str]]:
    """Where a config holds secrets: its Kafka client settings', and what the sinks' declarations name."""
    paths = [["kafka_config", key] for key in secret_keys(config.kafka_config)]
    paths += [["sink", *path] for path in spec_secret_paths(config.sink)]
    if config.dead_letter:
        paths += [["dead_letter", *path] for path in spec_secret_paths(config.dead_letter)]
    return paths
