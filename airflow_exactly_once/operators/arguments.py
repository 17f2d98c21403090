"""The operators' pipeline arguments, derived from one declaration.

Every pipeline setting is a field of `PipelineConfig` (core.config) with its default and one
sentence of documentation; the few settings that only say where things run (connections,
Spark) are `TASK_ARGUMENTS` below. The operators' `template_fields` and `:param` lines are made
from these two lists, and so is the source of `ExactlyOnceBaseOperator.__init__`'s typed signature
and of its attribute assignments (`init_source`): `python -m devtools.docs` writes them into
operators/base.py, where readers, IDEs, type checkers and Airflow's `default_args` see them as
written; tests/unit/test_docs.py fails until the file and the declaration agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.declaration import options_of
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.secrets import SECRET_KEY_PATTERN, matching_key_paths, secret_values
from airflow_exactly_once.pipeline_check import secret_paths
from airflow_exactly_once.sinks import SPECS


@dataclass(frozen=True)
class Argument:
    name: str
    default: Any
    doc: str
    templated: bool = True
    required: bool = False
    # A free-form dict whose keys matching this pattern hold secrets (core.declaration.argument's secret_keys).
    secret_keys: str | None = None
    # The values it may take (besides None where None is its default); empty: any value of its type.
    choices: tuple[Any, ...] = ()
    annotation: str = "str | None"  # its type in the operators' signature

    def signature_default(self) -> Any:
        """The default the signature shows: None for an empty list or dict (one object shared by every call would
        be), which the operator replaces with a fresh empty one."""
        return None if isinstance(self.default, (list, dict)) else self.default


TASK_ARGUMENTS = (
    Argument("kafka_conn_id", "kafka_default", "The official `kafka` connection: bootstrap servers and client "
                                               "security settings (librdkafka names) in its extra.", annotation="str"),
    Argument("ledger_conn_id", None, "Connection of the offset ledger (postgres, sqlite or exactly_once_ledger); "
                                     "default: the embedded SQLite file in AIRFLOW_HOME, for one machine only: "
                                     "refused under executors that run tasks on several machines (Celery, "
                                     "Kubernetes) unless [exactly_once] embedded_ledger_shared; see docs/ledger.md."),
    Argument("ledger_url", None, "SQLAlchemy URL of the ledger, instead of ledger_conn_id."),
    Argument("spark_conf", None, "Spark settings of the write (spark.master, spark.jars, ...); default local[*]. "
                                 "Keys matching Spark's `spark.redaction.regex` (secret, password, token, access "
                                 "key) and a `spark.remote` URL's token are secrets: masked in logs, never stored.",
             templated=False, secret_keys=SECRET_KEY_PATTERN, annotation="dict[str, Any] | None"),
    Argument("schema_registry_conn_id", None, "A `schema_registry` connection (URL, basic auth or bearer token, "
                                              "TLS files): the registry of value_format / key_format avro, "
                                              "protobuf and json_schema in the wire format."),
    Argument("spark_conn_id", None, "A `spark` connection: spark-submit the write to that cluster; or a "
                                    "`spark_connect` connection: run it on that Spark Connect server; default: a "
                                    "Spark driver in the task."),
    Argument("spark_connect_session", "pipeline",
             "On a Spark Connect server: 'pipeline' (the writes of a pipeline share one server-side session while "
             "the shipped code is the same: warm Python workers; what a transform sets in the session, settings "
             "or temporary views, stays for the next batch) or 'attempt' (a new session per write attempt, "
             "released after it, as a Spark driver per task would be).", templated=False,
             choices=("pipeline", "attempt"), annotation="str"),
)


# Where an operator takes more than the pipeline setting holds: one topic as text, the transform as a callable.
_OPERATOR_TYPES = {"topics": "str | list[str]", "transform": "str | Callable[..., Any] | None"}


def _pipeline_arguments() -> tuple[Argument, ...]:
    """PipelineConfig's declared settings; "{sink_types}" in a doc is the registry's list of sink types."""
    sink_types = ", ".join(SPECS)
    return tuple(Argument(o.name, o.default, o.doc.replace("{sink_types}", sink_types), o.templated, o.required,
                          choices=o.choices, annotation=_OPERATOR_TYPES.get(o.name, o.annotation))
                 for o in options_of(PipelineConfig))


PIPELINE_ARGUMENTS = _pipeline_arguments()
ARGUMENTS: tuple[Argument, ...] = PIPELINE_ARGUMENTS + TASK_ARGUMENTS
TEMPLATE_FIELDS: tuple[str, ...] = tuple(a.name for a in ARGUMENTS if a.templated)


def secret_texts(values: Mapping[str, Any]) -> list[str]:
    """Every secret in an operator's arguments (rendered or not), as text for Airflow's secrets masker: those the
    pipeline settings' declarations name, the declared keys of property dicts, and any URL's password."""
    paths = secret_paths(values)
    for a in ARGUMENTS:
        if a.secret_keys:
            paths += [[a.name, *path] for path in matching_key_paths(values.get(a.name), a.secret_keys)]
    return secret_values(values, paths)


def check_task_choices(values: Mapping[str, Any]) -> None:
    """The task arguments' allowed values (the pipeline settings' choices are checked by PipelineConfig)."""
    for a in TASK_ARGUMENTS:
        if a.choices and not a.templated and values[a.name] not in a.choices:
            raise ConfigurationError(f"{a.name}={values[a.name]!r} is not supported; choose one of "
                                     f"{', '.join(map(repr, a.choices))}")


def init_source(part: str) -> str:
    """The generated source of `ExactlyOnceBaseOperator.__init__` (operators/base.py): its `signature` (every
    argument keyword-only, typed, with its default; required ones without) or its `attributes` (each argument
    stored under its own name, with its type; an empty list or dict made anew)."""
    if part == "signature":
        lines = ["def __init__(", "    self,", "    *,"]
        for a in ARGUMENTS:
            default = a.signature_default()
            annotation = a.annotation if default is a.default or "None" in a.annotation else f"{a.annotation} | None"
            lines.append(f"    {a.name}: {annotation}," if a.required else
                         f"    {a.name}: {annotation} = {_literal(default)},")
        return "\n".join([*lines, "    **kwargs: Any,", ") -> None:"])
    if part == "attributes":
        return "\n".join(f"self.{a.name}: {a.annotation} = {a.name}" if a.signature_default() is a.default else
                         f"self.{a.name}: {a.annotation} = {_literal(a.default)} if {a.name} is None else {a.name}"
                         for a in ARGUMENTS)
    raise LookupError(f"no generated part {part!r} of the operators' __init__: 'signature' or 'attributes'")


def _literal(value: Any) -> str:
    """A default as source code, strings in double quotes as the package writes them."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def param_docs() -> str:
    """The `:param` lines of every argument, for the operators' docstrings."""
    return "\n".join(f"    :param {a.name}: {a.doc}" for a in ARGUMENTS)


def markdown_table() -> str:
    """The arguments as the Markdown table of docs/arguments.md: default, allowed values, whether templated
    (`python -m devtools.docs` writes it there; tests/unit/test_docs.py fails when the page differs)."""
    rows = ["| argument | default | allowed values | templated | what it is |", "|---|---|---|---|---|"]
    for a in ARGUMENTS:
        default = "required" if a.required else f"`{a.default!r}`"
        allowed = ", ".join(f"`{choice!r}`" for choice in a.choices)  # empty: any value of its type
        rows.append(f"| `{a.name}` | {default} | {allowed} | {'yes' if a.templated else 'no'} | {a.doc} |")
    return "\n".join(rows)

