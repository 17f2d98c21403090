"""A sink spec's values are checked against its declaration (core.declaration.SinkSpec) when the DAG is parsed,
with the message the task gives for the same value; a templated value waits for the task to render it."""

from __future__ import annotations

import importlib
from datetime import datetime
from typing import Any, get_type_hints

import pytest

from airflow_exactly_once.core.declaration import value_kind
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.operators.batch import PlanBatchOperator
from airflow_exactly_once.sinks import SPECS, create_committer, create_writer
from airflow_exactly_once.task_group import exactly_once_batch

PG = {"type": "postgres", "url": "postgresql://db/shop", "table": "orders"}
KAFKA = {"type": "kafka", "topic": "out"}
ICEBERG = {"type": "iceberg", "table": "db.events", "warehouse": "/data/lake"}

# One bad value of each kind a declaration knows: (spec, key, value), and the message the parser and the task give.
BAD_VALUES = {
    "a guarantee the sink does not implement": (
        KAFKA, "guarantee", "EXACTLY_ONSE",
        "the kafka sink does not implement guarantee='EXACTLY_ONSE'; choose one of NONE, AT_LEAST_ONCE, EXACTLY_ONCE"),
    "a guarantee only another sink implements": (
        {"type": "parquet", "path": "/data/out"}, "guarantee", "AT_LEAST_ONCE",
        "the parquet sink does not implement guarantee='AT_LEAST_ONCE'; choose one of EXACTLY_ONCE"),
    "a value outside the choices": (
        PG, "mode", "merge", "the postgres sink mode 'merge' is not supported; choose one of insert, upsert"),
    "text that is no whole number": (
        PG, "page_size", "many", "the postgres sink's page_size must be a whole number, not 'many' (e.g. 1000, the "
                                 "default)"),
    "an infinite number": (
        PG, "lock_timeout_ms", float("inf"), "the postgres sink's lock_timeout_ms must be a whole number, not inf (e.g. "
                                             "60000, the default)"),
    "a fraction for a whole number": (
        KAFKA, "transaction_timeout_ms", 1.5, "the kafka sink's transaction_timeout_ms must be a whole number, not "
                                              "1.5 (e.g. 600000, the default)"),
    "text for True or False": (
        ICEBERG, "create_table", "False", "the iceberg sink's create_table must be True or False, not 'False' (e.g. "
                                          "False, the default)"),
    "a number for text": (KAFKA, "topic", 5, "the kafka sink's topic must be text, not 5"),
    "text for a dict": (
        KAFKA, "producer_config", "linger.ms=5", "the kafka sink's producer_config must be a dict, not 'linger.ms=5'"),
    "a number for a list": (PG, "key_columns", 7, "the postgres sink's key_columns must be a list, not 7"),
}
CASES = pytest.mark.parametrize("spec, key, value, message", BAD_VALUES.values(), ids=BAD_VALUES.keys())


# Spark settings that name an Iceberg runtime of their own: parsing an Iceberg sink then passes on every pyspark line
# (tests/unit/test_iceberg_runtime_lines.py has the refusal of a line without a runtime).
OWN_ICEBERG_RUNTIME = {"spark.jars": "/jars/iceberg-spark-runtime.jar"}


def parse_dag(dag_id: str, **pipeline: Any) -> None:
    """What Airflow does with a DAG file: run it, operators and all."""
    from airflow.sdk import DAG

    with DAG(dag_id, schedule=None, start_date=datetime(2024, 1, 1)):
        exactly_once_batch(pipeline_id="p", topics="t", **{"spark_conf": OWN_ICEBERG_RUNTIME, **pipeline})


def error_of(call, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ConfigurationError) as error:
        call(*args, **kwargs)
    return str(error.value)


@CASES
def test_a_bad_value_fails_parsing_as_the_task_would(spec, key, value, message):
    bad = {**spec, key: value}
    assert error_of(create_committer, bad) == message  # the task: its sink is built from the rendered spec
    assert error_of(create_writer, bad) == message
    assert error_of(parse_dag, "bad_value", sink=bad) == message


@CASES
def test_a_bad_value_of_the_dead_letter_spec_fails_parsing(spec, key, value, message):
    assert error_of(parse_dag, "bad_dead_letter", sink={"type": "parquet", "path": "/data/out"},
                    bad_record_policy="dead_letter", dead_letter={**spec, key: value}) == message


@CASES
def test_a_templated_value_passes_parsing(spec, key, value, message):
    templated = {**spec, key: "{{ var.value.setting }}"}
    parse_dag("templated_value", sink=templated, bad_record_policy="dead_letter", dead_letter=templated)
    parse_dag("templated_type", sink={**spec, key: value, "type": "{{ var.value.sink_type }}"})


def test_a_templated_value_is_checked_when_the_task_renders_it(tmp_path):
    plan = PlanBatchOperator(task_id="plan", pipeline_id="p", topics="t", bootstrap_servers="127.0.0.1:9",
                             ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                             sink={**KAFKA, "guarantee": "{{ params.guarantee }}"})
    plan.render_template_fields({"params": {"guarantee": "EXACTLY_ONSE"}})
    assert error_of(plan.coordinator) == BAD_VALUES["a guarantee the sink does not implement"][-1]


def test_good_values_pass_as_given_or_as_a_rendered_template_gives_them():
    for spec in ({**KAFKA, "guarantee": "AT_LEAST_ONCE", "transaction_timeout_ms": "60000", "register_schemas": True,
                  "producer_config": {"linger.ms": 5}},
                 {**KAFKA, "guarantee": "", "transaction_timeout_ms": ""},  # how unset templates render: defaults
                 {**PG, "mode": "upsert", "page_size": 500, "key_columns": "id", "writers": None},
                 {**ICEBERG, "create_table": True, "partitioned_by": ["day"]}):
        parse_dag("good_values", sink=spec)
        create_committer(spec)
        create_writer(spec)


def test_a_sinks_writer_and_committer_are_made_from_its_declaration_and_so_implement_its_guarantees():
    for kind, declaration in SPECS.items():
        for side in ("writer_class", "committer_class"):
            module, _, name = getattr(declaration, side).partition(":")
            made = getattr(importlib.import_module(module), name)
            assert made.spec_type is declaration, (kind, side)  # SinkSide.guarantees reads spec_type.guarantees


def test_every_declared_setting_is_checked_by_kind_unless_it_takes_anything():
    """A setting declared with a type the checks do not know would go unchecked: declare it as Any instead."""
    for declaration in SPECS.values():
        declared = get_type_hints(declaration)
        unchecked = [o.name for o in declaration.options() if value_kind(declared[o.name]) is None
                     and declared[o.name] is not Any]
        assert not unchecked, (declaration.type_name, unchecked)
