"""A pipeline's whole check: the protocol's rules, the Kafka client settings, the value format, the sinks'.

core.config declares every setting and core.config_checks checks what the protocol needs; what
Kafka's clients, a value schema and each sink accept is known in their own packages, and put
together here. This is also where the secrets of a config are found (`PipelineConfig.secret_paths`),
so the ledger never stores one.
"""

from __future__ import annotations

from typing import Any, Mapping

from airflow_exactly_once.core.config import REGISTRY_SECRET_KEYS, PipelineConfig
from airflow_exactly_once.core.config_checks import validate_config
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.secrets import url_paths
from airflow_exactly_once.kafka.setting_names import secret_keys
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.records.avro_schema import record_fields
from airflow_exactly_once.sinks import spec_secret_paths


def checked(config: PipelineConfig) -> PipelineConfig:
    """`config` validated by every rule, with its secrets located; raises ConfigurationError naming what to fix."""
    validate_config(config)
    KafkaSettings.of(config).require_servers().check()
    if config.value_format == "avro" and not config.uses_registry("value"):
        record_fields(config.value_schema)
    config.secret_paths = secret_paths(config.to_dict())
    return config


def secret_paths(settings: Mapping[str, Any]) -> list[list[str]]:
    """Where pipeline settings (a config as a dict, or an operator's arguments, maybe not yet rendered) hold
    secrets: their Kafka client settings', what the sinks' declarations name, and any URL with a password."""
    kafka_config = settings.get("kafka_config")
    paths = [["kafka_config", key] for key in secret_keys(kafka_config if isinstance(kafka_config, dict) else None)]
    registry = settings.get("schema_registry")
    if isinstance(registry, dict):
        paths += [["schema_registry", key] for key in REGISTRY_SECRET_KEYS if registry.get(key) not in (None, "")]
    for name in ("sink", "dead_letter"):
        paths += [[name, *path] for path in _spec_paths(settings.get(name))]
    paths += url_paths(settings)
    return [list(p) for p in dict.fromkeys(tuple(p) for p in paths)]


def _spec_paths(spec: Any) -> list[list[str]]:
    """A sink spec's secret paths; none for a spec that is still a template, or not yet valid (checked later)."""
    if not isinstance(spec, dict):
        return []
    try:
        return spec_secret_paths(spec)
    except ConfigurationError:
        return []
