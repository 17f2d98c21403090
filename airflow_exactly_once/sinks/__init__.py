"""Sink types, built from a JSON spec such as {"type": "parquet", "path": "/data/out"}.

Each sink is three small pieces (see core.sink): a partition writer, a committable and the
committer; a sink package is imported only when a pipeline uses it, so its client library
(kafka-python, psycopg2) is needed only then.
"""

from __future__ import annotations

import importlib
from typing import Any

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.sink import Sink
from airflow_exactly_once.records.bad_records import dead_letter_spec
from airflow_exactly_once.records.dead_letter import SinkWithDeadLetters

# [START sink_types]
SINK_TYPES = {
    "parquet": "airflow_exactly_once.sinks.parquet:ParquetSink",
    "postgres": "airflow_exactly_once.sinks.postgres.sink:PostgresSink",
    "kafka": "airflow_exactly_once.sinks.kafka.sink:KafkaSink",
    "iceberg": "airflow_exactly_once.sinks.iceberg.sink:IcebergSink",
}
# [END sink_types]


def sink_class(spec: dict[str, Any]) -> type[Sink]:
    """The class of a sink spec's type; its module (and client library) is imported only now."""
    kind = (spec or {}).get("type")
    if kind not in SINK_TYPES:
        raise ConfigurationError(f"unknown sink type {kind!r}; choose one of {', '.join(sorted(SINK_TYPES))}")
    module, _, name = SINK_TYPES[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def create_sink(spec: dict[str, Any]) -> Sink:
    return sink_class(spec)(spec)


def spec_secret_paths(spec: dict[str, Any]) -> list[list[str]]:
    """Where a sink spec holds secrets, as key paths within it."""
    return sink_class(spec).secret_paths(spec)


def pipeline_sink(config: PipelineConfig) -> Sink:
    """The sink of a pipeline: its output sink, paired with its dead-letter destination under
    bad_record_policy="dead_letter"."""
    output = create_sink(config.sink)
    if config.bad_record_policy != "dead_letter":
        return output
    return SinkWithDeadLetters(output, create_sink(dead_letter_spec(config)))
