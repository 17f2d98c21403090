"""The operators' arguments, template fields and :param lines come from one declaration."""

from __future__ import annotations

import inspect
from dataclasses import fields
from datetime import datetime

import pytest

from airflow_exactly_once.airflow_integration.compat import BaseOperator
from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.operators import arguments
from airflow_exactly_once.operators.batch import (
    AbortBatchOperator,
    ExactlyOnceBaseOperator,
    NotifyCompleteOperator,
    PlanBatchOperator,
    WriteBatchOperator,
)
from airflow_exactly_once.spark.connect_server.stop import stop_batch_attempts
from airflow_exactly_once.task_group import exactly_once_batch

OPERATORS = (PlanBatchOperator, WriteBatchOperator, NotifyCompleteOperator, AbortBatchOperator)
SINK = {"type": "parquet", "path": "/tmp/out"}


def test_every_pipeline_setting_is_an_argument_with_its_doc():
    settings = {f.name for f in fields(PipelineConfig) if f.metadata.get("argument", True)}
    assert settings == {a.name for a in arguments.PIPELINE_ARGUMENTS}
    params = inspect.signature(ExactlyOnceBaseOperator.__init__).parameters
    for operator in OPERATORS:
        doc = inspect.getdoc(operator.__mro__[-len(BaseOperator.__mro__) - 1])
        for argument in arguments.ARGUMENTS:
            assert argument.name in params, argument.name
            assert f":param {argument.name}: {argument.doc}" in doc
        assert set(operator.template_fields) >= {a.name for a in arguments.ARGUMENTS if a.templated}
        assert "transform" not in operator.template_fields  # Airflow would call a callable found there


def test_operators_store_arguments_and_fill_defaults(tmp_path):
    plan = PlanBatchOperator(task_id="plan", pipeline_id="p", topics="t", sink=SINK, max_records_per_partition=7)
    assert plan.max_records_per_partition == 7 and plan.kafka_conn_id == "kafka_default"
    assert plan.startup_mode == "earliest" and plan.kafka_config == {}
    other = PlanBatchOperator(task_id="plan2", pipeline_id="p", topics="t", sink=SINK)
    assert other.kafka_config is not plan.kafka_config  # no shared mutable default


def distinct_value(argument: arguments.Argument) -> object:
    """A value no other argument gets: Jinja text naming it where it is templated (as a DAG may give it), else an
    object of its own (or its last allowed value, where the operator checks its choices)."""
    if argument.templated:
        return f"{{{{ params.{argument.name} }}}}"
    return argument.choices[-1] if argument.choices else object()


def test_the_operators_attributes_are_exactly_the_declared_arguments():
    """batch.py assigns each argument to an attribute of its own name; the declaration makes the signature, template
    fields and docs. An argument declared but not assigned (or assigned to another name), or an attribute assigned
    that is not declared, fails here."""
    given = {a.name: distinct_value(a) for a in arguments.ARGUMENTS}
    plan = PlanBatchOperator(task_id="plan", **given)
    for name, value in given.items():
        assert getattr(plan, name) is value, name
    own = set(vars(plan)) - set(vars(BaseOperator(task_id="plain")))
    assert own == set(given) | {"write_task_id", "notify_task_id"}
    assert list(inspect.signature(ExactlyOnceBaseOperator.__init__).parameters)[1:-1] == list(given)


def test_the_signature_in_the_source_is_the_declared_one():
    """batch.py's __init__ is written out (typed, for readers, IDEs and mypy) by `python -m devtools.docs`; a
    default, type or argument changed in the declaration and not there fails test_docs; this checks what Python
    makes of it: each argument keyword-only with the declared default (a fresh empty list or dict for [] and {})."""
    params = inspect.signature(ExactlyOnceBaseOperator.__init__).parameters
    for a in arguments.ARGUMENTS:
        param = params[a.name]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY, a.name
        assert param.default == (inspect.Parameter.empty if a.required else a.signature_default()), a.name
    declared = {a.name: a.default for a in arguments.ARGUMENTS}
    assert (params["kafka_config"].default, declared["kafka_config"]) == (None, {})


def test_airflow_renders_the_declared_attributes_with_params():
    plan = PlanBatchOperator(task_id="plan", pipeline_id="{{ params.name }}", topics=["{{ params.topic }}"],
                             sink={"type": "parquet", "path": "/data/{{ params.name }}"}, retention_days="{{ 3 + 4 }}",
                             transform="{{ not.rendered }}")
    plan.render_template_fields({"params": {"name": "orders", "topic": "in"}})
    assert (plan.pipeline_id, plan.topics, plan.sink) == ("orders", ["in"], {"type": "parquet", "path": "/data/orders"})
    assert plan.retention_days == "7" and plan.transform == "{{ not.rendered }}"  # transform is no template field


def test_default_args_reach_pipeline_arguments():
    from airflow.sdk import DAG

    with DAG("args_test", schedule=None, start_date=datetime(2024, 1, 1),
             default_args={"kafka_conn_id": "kafka_prod", "ledger_conn_id": "ledger_pg", "retries": 4}):
        group = exactly_once_batch(pipeline_id="p", topics="t", sink=SINK)
    tasks = {t.task_id.rpartition(".")[2]: t for t in group}
    assert {t.kafka_conn_id for t in tasks.values()} == {"kafka_prod"}
    assert {t.ledger_conn_id for t in tasks.values()} == {"ledger_pg"}
    assert tasks["plan"].write_task_id == tasks["write"].task_id
    assert tasks["plan"].notify_task_id == tasks["notify_complete"].task_id


def test_the_docs_table_is_generated_from_the_same_declaration():
    table = arguments.markdown_table()
    for argument in arguments.ARGUMENTS:
        assert f"| `{argument.name}` |" in table


def test_pipelines_on_spark_connect_stop_earlier_attempts_before_releasing(tmp_path):
    """abort and plan's recovery get the Spark Connect server's stop (issue 30); in-task writes need none."""
    common = dict(pipeline_id="p", topics="t", sink=SINK, bootstrap_servers="127.0.0.1:9",
                  ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}")
    remote = AbortBatchOperator(task_id="abort", spark_conf={"spark.remote": "sc://127.0.0.1:15002/;token=secret"},
                                **common)
    stop = remote.coordinator().stop_attempts
    assert stop.func is stop_batch_attempts and stop.args == ("sc://127.0.0.1:15002/;token=secret",)
    assert AbortBatchOperator(task_id="abort2", **common).coordinator().stop_attempts is None


def test_a_mistyped_sink_key_fails_when_the_dag_is_parsed():
    from airflow.sdk import DAG

    with DAG("typo_test", schedule=None, start_date=datetime(2024, 1, 1)):
        with pytest.raises(ConfigurationError,
                           match=r"the parquet sink has no setting 'pth' \(did you mean 'path'\?\)"):
            exactly_once_batch(group_id="g1", pipeline_id="p", topics="t", sink={"type": "parquet", "pth": "/tmp/out"})
        with pytest.raises(ConfigurationError, match=r"the kafka sink has no setting 'topics' \(did you mean 'topic'"):
            exactly_once_batch(group_id="g2", pipeline_id="p", topics="t", sink=SINK, bad_record_policy="dead_letter",
                               dead_letter={"type": "kafka", "topics": "dlq"})
        with pytest.raises(ConfigurationError, match="unknown sink type 'parket'; choose one of delta, iceberg, kafka, "
                                                     "parquet, postgres"):
            exactly_once_batch(group_id="g3", pipeline_id="p", topics="t", sink={"type": "parket", "path": "/tmp/out"})
        # Values may be templates: only keys are checked before rendering.
        exactly_once_batch(group_id="g4", pipeline_id="p", topics="t",
                           sink={"type": "parquet", "path": "{{ var.value.out }}"})


def test_the_plan_task_hands_the_planner_the_due_time_only_of_a_cleared_run():
    """Invariant 2 across retention needs to know whether Airflow cleared the run (its clear_number) and when it
    was due (run_after); a run never cleared plans as usual."""
    from datetime import timezone
    from types import SimpleNamespace

    from airflow_exactly_once.operators.batch import _cleared_run_after

    due = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
    assert _cleared_run_after({"dag_run": SimpleNamespace(clear_number=2, run_after=due)}) == 1_793_534_400_000
    assert _cleared_run_after({"dag_run": SimpleNamespace(clear_number=0, run_after=due)}) is None
    assert _cleared_run_after({"dag_run": SimpleNamespace(run_after=due)}) is None
    assert _cleared_run_after({}) is None
