"""The sink registry: each type's spec declaration and its sink class, from a spec such as
{"type": "parquet", "path": "/data/out"}.

Each sink is three small pieces (see core.sink): a partition writer, a committable and the
committer; and a declaration of its spec (core.declaration.SinkSpec), light enough to check a
DAG's sink keys when it is parsed. A sink class is imported only when a pipeline uses it, so
its client library (confluent-kafka, psycopg2, pyiceberg) is needed only then. Everything that
differs by sink type outside the sinks (defaults of dead-letter destinations, which settings
are secret, the list of types) is asked of this registry.
"""

from __future__ import annotations

import importlib
from typing import Any

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.declaration import SinkSpec, is_template
from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError
from airflow_exactly_once.core.sink import Sink
from airflow_exactly_once.records.dead_letter import SinkWithDeadLetters
from airflow_exactly_once.sinks.iceberg.spec import IcebergSpec
from airflow_exactly_once.sinks.kafka.spec import KafkaSpec
from airflow_exactly_once.sinks.parquet.spec import ParquetSpec
from airflow_exactly_once.sinks.postgres.spec import PostgresSpec

# [START sink_types]
SINK_TYPES = {
    "parquet": "airflow_exactly_once.sinks.parquet.sink:ParquetSink",
    "postgres": "airflow_exactly_once.sinks.postgres.sink:PostgresSink",
    "kafka": "airflow_exactly_once.sinks.kafka.sink:KafkaSink",
    "iceberg": "airflow_exactly_once.sinks.iceberg.sink:IcebergSink",
}
SPECS: dict[str, type[SinkSpec]] = {spec.type_name: spec for spec in (ParquetSpec, PostgresSpec, KafkaSpec,
                                                                      IcebergSpec)}
# [END sink_types]


def spec_type(spec: Any, what: str = "sink") -> type[SinkSpec]:
    """The declaration of a sink spec's type; `what` names the argument in errors ("sink", "dead_letter")."""
    if not isinstance(spec, dict) or "type" not in spec:
        raise ConfigurationError(f"{what} must be a dict with a 'type', e.g. {{'type': 'parquet', 'path': "
                                 "'/data/out'}")
    kind = spec["type"]
    if kind not in SPECS:
        raise ConfigurationError(f"unknown sink type {kind!r}; choose one of {', '.join(sorted(SPECS))}")
    return SPECS[kind]


def sink_class(spec: dict[str, Any]) -> type[Sink]:
    """The class of a sink spec's type; its module (and client library) is imported only now."""
    kind = spec_type(spec).type_name
    module, _, name = SINK_TYPES[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def create_sink(spec: dict[str, Any]) -> Sink:
    return sink_class(spec)(spec)


def stored_commit_deadline_ms(config: dict[str, Any]) -> int | None:
    """How long a pipeline's sink keeps staged output (Kafka: transaction_timeout_ms; with dead letters, the
    shorter of the two destinations'), if it has a limit, from the pipeline's configuration as the ledger stores
    it: the deadline the steps see. None also when that sink cannot be built here."""
    try:
        try:
            sink = pipeline_sink(PipelineConfig.from_dict(config))
        except (ExactlyOnceError, TypeError, ValueError):  # not a whole pipeline's configuration: its sink alone
            sink = create_sink(dict(config.get("sink") or {}))
        return sink.commit_deadline_ms()
    except (ExactlyOnceError, ImportError, TypeError, ValueError):
        return None


def check_sink_spec_at_parse(spec: Any, what: str = "sink") -> None:
    """When a DAG is parsed: the sink type exists, the spec has no unknown key, and each value that is not a
    template is one its declaration allows (the messages the task gives).

    A spec that is itself a template (a string), or whose type is, is checked when the task renders it.
    """
    if isinstance(spec, dict) and not is_template(spec.get("type")):
        spec_type(spec, what).check_before_rendering(spec)


def spec_secret_paths(spec: dict[str, Any]) -> list[list[str]]:
    """Where a sink spec holds secrets, as key paths within it (from its declaration)."""
    return spec_type(spec).secret_paths(spec)


def spec_local_folders(spec: Any, what: str = "sink") -> list[tuple[str, str, str]]:
    """(where, value, what to use instead) of each folder of a sink spec that only the task's machine sees; none for a
    spec that is still a template or of an unknown type (the sink's own checks name those)."""
    if not isinstance(spec, dict) or spec.get("type") not in SPECS:
        return []
    declaration = SPECS[spec["type"]]
    return [(f"{what} {key}", value, declaration.shared_storage) for key, value in declaration.local_folders(spec)]


def dead_letter_spec(config: PipelineConfig) -> dict[str, Any]:
    """The dead-letter destination of a pipeline: the given one, or the output sink's default beside it,
    completed for its use as a dead-letter destination."""
    given = dict(config.dead_letter or {}) or spec_type(config.sink).dead_letter_beside(config.sink)
    return spec_type(given, "dead_letter").as_dead_letter(given, config.pipeline_id, config.sink)


def pipeline_sink(config: PipelineConfig) -> Sink:
    """The sink of a pipeline: its output sink, paired with its dead-letter destination under
    bad_record_policy="dead_letter"."""
    output = create_sink(config.sink)
    if config.bad_record_policy != "dead_letter":
        return output
    return SinkWithDeadLetters(output, create_sink(dead_letter_spec(config)))
