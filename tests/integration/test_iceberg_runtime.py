"""Iceberg's Spark runtime on the test stack's own pyspark line, through the operators Airflow runs.

On a line Iceberg publishes a runtime for (the primary stack, 4.0) a DAG with an Iceberg sink parses
and its plan step plans a batch from a real broker; on one it publishes none for (the newest stack,
4.2) the DAG is refused when it is parsed, and a plan step whose settings are only rendered when it
runs fails for good before it plans anything, with the error that names the line, the lines that
have a runtime and the fixes; never Spark's failure to start. `make test-newest` runs this file.
"""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from airflow_exactly_once.airflow_integration.compat import AirflowFailException
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.operators.batch import PlanBatchOperator
from airflow_exactly_once.sinks.iceberg.runtime import ICEBERG_RELEASE, ICEBERG_SPARK_RUNTIME
from airflow_exactly_once.spark.packages import iceberg_package, spark_version
from airflow_exactly_once.task_group import exactly_once_batch
from tests.harness import open_ledger
from tests.helpers import create_topic, produce

LINE = ".".join(spark_version().split(".")[:2])
HAS_RUNTIME = ICEBERG_SPARK_RUNTIME.release_for(LINE) is not None
REFUSAL = (rf"no build for Spark {re.escape(LINE)} \(the installed pyspark: {re.escape(spark_version())}\); it is "
           r"published for Spark 3\.5 \(Scala 2\.12 or 2\.13\), 4\.0 \(Scala 2\.13\) and 4\.1 \(Scala 2\.13\) in "
           rf"release {re.escape(ICEBERG_RELEASE)}\. Run the write on Spark of one of those lines")


@pytest.fixture
def no_spark_settings(monkeypatch, tmp_path):
    """The installed pyspark as a user has it: no spark-defaults.conf naming Iceberg's jars (the tests' own does)."""
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "spark-conf"))
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")  # the embedded ledger is fine on one machine


def iceberg_sink(tmp_path) -> dict:
    return {"type": "iceberg", "table": "db.events", "warehouse": str(tmp_path / "lake"), "create_table": True}


def test_a_dag_with_an_iceberg_sink_parses_only_where_a_runtime_exists(no_spark_settings, tmp_path):
    from airflow.sdk import DAG

    def parse() -> DAG:
        with DAG("iceberg_runtime", schedule=None, start_date=datetime(2024, 1, 1)) as dag:
            exactly_once_batch(pipeline_id="p", topics="t", bootstrap_servers="127.0.0.1:9", sink=iceberg_sink(tmp_path),
                               ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}")
        return dag

    if HAS_RUNTIME:
        assert "org.apache.iceberg:iceberg-spark-runtime-" in iceberg_package()
        assert {t.split(".")[-1] for t in parse().task_ids} >= {"plan", "write", "notify_complete"}
    else:
        with pytest.raises(ConfigurationError, match=REFUSAL):
            parse()
    assert not (tmp_path / "lake").exists()


def test_the_plan_step_plans_only_where_a_runtime_exists(no_spark_settings, kafka, tmp_path, unique):
    topic = f"ice-runtime-{unique}"
    create_topic(kafka.bootstrap_servers, topic, partitions=1)
    produce(kafka.bootstrap_servers, topic, 5, partitions=1)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    # A templated spark_conf is rendered only when the task runs: parsing leaves the check to the plan.
    plan = PlanBatchOperator(task_id="plan", pipeline_id=f"ice-{unique}", topics=topic,
                             bootstrap_servers=kafka.bootstrap_servers, sink=iceberg_sink(tmp_path),
                             ledger_url=ledger_url, startup_mode="earliest",
                             spark_conf={"spark.sql.shuffle.partitions": "{{ params.partitions }}"})
    plan.render_template_fields({"params": {"partitions": "2"}})
    if HAS_RUNTIME:
        assert plan.execute({"run_id": "manual__1"}) == f"ice-{unique}:1"
    else:
        with pytest.raises(AirflowFailException, match="^ConfigurationError: Iceberg's Spark runtime .*" + REFUSAL):
            plan.execute({"run_id": "manual__1"})
    ledger = open_ledger(tmp_path / "ledger.db")
    planned = ledger.list_batches(f"ice-{unique}")
    assert [b.seq for b in planned] == ([1] if HAS_RUNTIME else [])
