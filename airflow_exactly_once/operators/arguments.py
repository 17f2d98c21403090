"""The operators' pipeline arguments, derived from one declaration.

Every pipeline setting is a field of `PipelineConfig` (core.config) with its default and one
sentence of documentation; the few settings that only say where things run (connections,
Spark) are `TASK_ARGUMENTS` below. The operators' keyword arguments, their signature (which
Airflow's `default_args` reads), their `template_fields` and their `:param` lines are all
made from these two lists. An argument added here is also assigned, by name and with its type,
in `ExactlyOnceBaseOperator.__init__` (operators.batch), where readers and type checkers see it;
tests/unit/test_arguments.py fails until the two agree.
"""

from __future__ import annotations

import copy
import inspect
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


TASK_ARGUMENTS = (
    Argument("kafka_conn_id", "kafka_default", "The official `kafka` connection: bootstrap servers and client "
                                               "security settings (librdkafka names) in its extra."),
    Argument("ledger_conn_id", None, "Connection of the offset ledger (postgres, sqlite or exactly_once_ledger); "
                                     "default: the embedded SQLite file in AIRFLOW_HOME, for one machine only: "
                                     "refused under executors that run tasks on several machines (Celery, "
                                     "Kubernetes) unless [exactly_once] embedded_ledger_shared; see docs/ledger.md."),
    Argument("ledger_url", None, "SQLAlchemy URL of the ledger, instead of ledger_conn_id."),
    Argument("spark_conf", None, "Spark settings of the write (spark.master, spark.jars, ...); default local[*]. "
                                 "Keys matching Spark's `spark.redaction.regex` (secret, password, token, access "
                                 "key) and a `spark.remote` URL's token are secrets: masked in logs, never stored.",
             templated=False, secret_keys=SECRET_KEY_PATTERN),
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
             choices=("pipeline", "attempt")),
)


def _pipeline_arguments() -> tuple[Argument, ...]:
    """PipelineConfig's declared settings; "{sink_types}" in a doc is the registry's list of sink types."""
    sink_types = ", ".join(SPECS)
    return tuple(Argument(o.name, o.default, o.doc.replace("{sink_types}", sink_types), o.templated, o.required,
                          choices=o.choices) for o in options_of(PipelineConfig))


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


def take_arguments(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the pipeline arguments out of an operator's keyword arguments, defaults filled in."""
    missing = [a.name for a in ARGUMENTS if a.required and a.name not in kwargs]
    if missing:
        raise TypeError(f"missing required pipeline argument(s): {', '.join(missing)}")
    given = {a.name: kwargs.pop(a.name) if a.name in kwargs else copy.copy(a.default) for a in ARGUMENTS}
    for a in TASK_ARGUMENTS:  # the pipeline settings' choices are checked by PipelineConfig
        if a.choices and not a.templated and given[a.name] not in a.choices:
            raise ConfigurationError(f"{a.name}={given[a.name]!r} is not supported; choose one of "
                                     f"{', '.join(map(repr, a.choices))}")
    return given


def signature(extra: tuple[inspect.Parameter, ...] = ()) -> inspect.Signature:
    """`(self, *, <arguments>, **kwargs)`: what `inspect.signature` (and so `default_args`) sees."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY,
                                 default=inspect.Parameter.empty if a.required else a.default) for a in ARGUMENTS]
    params += list(extra)
    params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


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


def keyword(name: str, default: Any) -> inspect.Parameter:
    """A keyword-only parameter of one operator, for `signature(extra=...)`."""
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
