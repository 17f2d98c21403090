"""The sink registry: each type's spec declaration, and the writer and committer it names, from a spec such as
{"type": "parquet", "path": "/data/out"}.

Each sink is a few small pieces (see core.sink): a partition writer, a committable, the sink's
writer (core.sink_writer) and its committer (core.sink_committer); and a declaration of its spec
(core.declaration.SinkSpec), light enough to check a DAG's sink keys when it is parsed, which
names the writer and committer classes as "module:Class". They are imported only when a pipeline
uses the sink, so its client library (confluent-kafka, psycopg2, pyiceberg, deltalake) is needed only then.
Everything that differs by sink type outside the sinks (defaults of dead-letter destinations,
which settings are secret, the list of types) is asked of this registry.

The package's own sinks are `SPECS`; other distributions add theirs through the entry point group
`airflow_exactly_once.sinks` (sinks.installed), and every look-up by type finds both.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.declaration import SinkSpec, is_template
from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError
from airflow_exactly_once.core.line_packages import LinePackage
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.core.sink_writer import SinkWriter
from airflow_exactly_once.sinks.dead_letters import PairedCommitter, PairedWriter
from airflow_exactly_once.sinks.delta.spec import DeltaSpec
from airflow_exactly_once.sinks.iceberg.spec import IcebergSpec
from airflow_exactly_once.sinks.installed import InstalledSinks
from airflow_exactly_once.sinks.kafka.spec import KafkaSpec
from airflow_exactly_once.sinks.parquet.spec import ParquetSpec
from airflow_exactly_once.sinks.postgres.spec import PostgresSpec

# [START sink_types]
# The package's own sinks (the docs list these).
SPECS: dict[str, type[SinkSpec]] = {spec.type_name: spec for spec in (ParquetSpec, PostgresSpec, KafkaSpec,
                                                                      IcebergSpec, DeltaSpec)}
# Those other distributions declare in the entry point group "airflow_exactly_once.sinks".
INSTALLED = InstalledSinks()
# [END sink_types]


def sink_types() -> list[str]:
    """Every sink type a spec may name: the package's own, then those other distributions declare (the names
    only: nothing of theirs is imported)."""
    return [*SPECS, *(name for name in INSTALLED.names() if name not in SPECS)]


def spec_type(spec: Any, what: str = "sink") -> type[SinkSpec]:
    """The declaration of a sink spec's type, built in or another distribution's; `what` names the argument in
    errors ("sink", "dead_letter")."""
    if not isinstance(spec, dict) or "type" not in spec:
        raise ConfigurationError(f"{what} must be a dict with a 'type', e.g. {{'type': 'parquet', 'path': "
                                 "'/data/out'}")
    kind = spec["type"]
    INSTALLED.refuse_clash(kind, SPECS)
    declaration = SPECS.get(kind) or INSTALLED.spec(kind)
    if declaration is None:
        raise ConfigurationError(f"unknown sink type {kind!r}; choose one of {', '.join(sorted(sink_types()))} "
                                 "(a sink of another distribution: pip install it)")
    return declaration


def _imported(declaration: type[SinkSpec], side: str, spec: dict[str, Any]) -> type:
    """The writer or committer class (`side`: "writer_class", "committer_class") a declaration names as
    "module:Class" for `spec` (the variant it picks); its module (and client library) is imported only now."""
    module, _, name = declaration.side_class(spec, side).partition(":")
    if not module or not name:
        raise ConfigurationError(f"the {declaration.type_name} sink's declaration ({declaration.__name__}) names no "
                                 f"{side} as 'module:Class'; set it to its sink's class")
    return getattr(importlib.import_module(module), name)


def sink_commands() -> list[Callable[..., None]]:
    """The functions that add each built-in sink's own CLI commands (a declaration's `commands`), imported now."""
    found = []
    for declaration in SPECS.values():
        module, _, name = declaration.commands.partition(":")
        if module:
            found.append(getattr(importlib.import_module(module), name))
    return found


def create_writer(spec: dict[str, Any]) -> SinkWriter:
    """The write side of a sink spec (unbound: `bind` gives it the pipeline and the sink's committer)."""
    return _imported(spec_type(spec), "writer_class", spec)(spec)


def create_committer(spec: dict[str, Any]) -> SinkCommitter:
    """The commit side of a sink spec (unbound: `bind` gives it the pipeline and the ledger's history)."""
    return _imported(spec_type(spec), "committer_class", spec)(spec)


def stored_commit_deadline_ms(config: dict[str, Any]) -> int | None:
    """How long a pipeline's sink keeps staged output (Kafka: transaction_timeout_ms; with dead letters, the
    shorter of the two destinations'), if it has a limit, from the pipeline's configuration as the ledger stores
    it: the deadline the steps see. None also when that sink cannot be built here."""
    try:
        try:
            committer = pipeline_committer(PipelineConfig.from_dict(config))
        except (ExactlyOnceError, TypeError, ValueError):  # not a whole pipeline's configuration: its sink alone
            committer = create_committer(dict(config.get("sink") or {}))
        return committer.commit_deadline_ms()
    except (ExactlyOnceError, ImportError, TypeError, ValueError):
        return None


def check_sink_spec_at_parse(spec: Any, what: str = "sink") -> None:
    """When a DAG is parsed: the sink type exists, the spec has no unknown key, and each value that is not a
    template is one its declaration allows (the messages the task gives).

    A spec that is itself a template (a string), or whose type is, is checked when the task renders it.
    """
    if isinstance(spec, dict) and not is_template(spec.get("type")):
        spec_type(spec, what).check_before_rendering(spec)


def spec_line_packages(spec: Any, what: str = "sink") -> tuple[LinePackage, ...]:
    """The JVM libraries a sink spec's write needs that are built for some Spark lines only (from its declaration);
    none for a spec that is still a template or of an unknown type (the sink's own checks name those)."""
    if not isinstance(spec, dict) or spec.get("type") not in sink_types():
        return ()
    return spec_type(spec, what).line_packages


def spec_secret_paths(spec: dict[str, Any]) -> list[list[str]]:
    """Where a sink spec holds secrets, as key paths within it (from its declaration)."""
    return spec_type(spec).secret_paths(spec)


def spec_local_folders(spec: Any, what: str = "sink") -> list[tuple[str, str, str]]:
    """(where, value, what to use instead) of each folder of a sink spec that only the task's machine sees; none for a
    spec that is still a template or of an unknown type (the sink's own checks name those)."""
    if not isinstance(spec, dict) or spec.get("type") not in sink_types():
        return []
    declaration = spec_type(spec, what)
    return [(f"{what} {key}", value, declaration.shared_storage) for key, value in declaration.local_folders(spec)]


def dead_letter_spec(config: PipelineConfig) -> dict[str, Any]:
    """The dead-letter destination of a pipeline: the given one, or the output sink's default beside it,
    completed for its use as a dead-letter destination."""
    given = dict(config.dead_letter or {}) or spec_type(config.sink).dead_letter_beside(config.sink)
    return spec_type(given, "dead_letter").as_dead_letter(given, config.pipeline_id, config.sink)


def pipeline_committer(config: PipelineConfig) -> SinkCommitter:
    """The commit side of a pipeline's sink: its output's committer, paired with its dead-letter destination's
    under bad_record_policy="dead_letter" (unbound: the coordinator binds it)."""
    output = create_committer(config.sink)
    if config.bad_record_policy != "dead_letter":
        return output
    return PairedCommitter(output, create_committer(dead_letter_spec(config)))


def pipeline_writer(config: PipelineConfig) -> SinkWriter:
    """The write side of a pipeline's sink, paired like its committer (unbound: the write binds it to the
    coordinator's committer)."""
    output = create_writer(config.sink)
    if config.bad_record_policy != "dead_letter":
        return output
    return PairedWriter(output, create_writer(dead_letter_spec(config)))
