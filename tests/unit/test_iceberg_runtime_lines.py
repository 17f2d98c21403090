"""Iceberg's Spark runtime per Spark line: the table, the refusal of a line without one (when a DAG is parsed, a batch
planned, a session built), and the user's own runtime winning."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.line_packages import LinePackage, LineRelease, default_scala
from airflow_exactly_once.operators.write_launch import check_packages_at_parse
from airflow_exactly_once.sinks import create_writer, spec_line_packages
from airflow_exactly_once.sinks.iceberg.runtime import ICEBERG_RELEASE, ICEBERG_SPARK_RUNTIME
from airflow_exactly_once.spark import in_process_session
from airflow_exactly_once.spark import packages as spark_packages

ICEBERG = {"type": "iceberg", "table": "db.events", "warehouse": "/data/lake"}
PARQUET = {"type": "parquet", "path": "/data/out"}
OWN_BUILD = "org.example:iceberg-spark-runtime-4.2_2.13:1.11.0-ours"


@pytest.fixture
def spark_4_2(monkeypatch, tmp_path):
    """The installed pyspark as 4.2.0 (a line Iceberg publishes no runtime for), with no Spark settings of the
    machine's (spark-defaults.conf, PYSPARK_SUBMIT_ARGS) that could name one."""
    monkeypatch.setattr(spark_packages, "spark_version", lambda: "4.2.0")
    monkeypatch.setattr(spark_packages, "scala_version", lambda home=None, version=None: "2.13")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)


@pytest.mark.parametrize("version, scala, line", [
    ("3.5.7", "2.12", "3.5"), ("3.5.7", "2.13", "3.5"), ("4.0.0", "2.13", "4.0"), ("4.1.1", "2.13", "4.1")])
def test_every_line_with_a_runtime_gets_it_at_the_one_release(version, scala, line):
    assert spark_packages.iceberg_package(version, scala) == \
        f"org.apache.iceberg:iceberg-spark-runtime-{line}_{scala}:{ICEBERG_RELEASE}"
    assert {r.release for r in ICEBERG_SPARK_RUNTIME.releases} == {ICEBERG_RELEASE}
    assert [r.spark_line for r in ICEBERG_SPARK_RUNTIME.releases] == ["3.5", "4.0", "4.1"]


@pytest.mark.parametrize("version, scala, named", [
    ("4.2.0", "2.13", "no build for Spark 4.2 "), ("3.4.4", "2.12", "no build for Spark 3.4 "),
    ("4.0.0", "2.12", "no build for Spark 4.0 with Scala 2.12")])
def test_a_line_without_a_runtime_is_an_error_naming_it_what_exists_and_the_fixes(version, scala, named):
    with pytest.raises(ConfigurationError) as caught:
        spark_packages.iceberg_package(version, scala)
    message = str(caught.value)
    assert named in message and f"({'the write' + chr(39) + 's Spark'}: {version})" in message
    assert "Spark 3.5 (Scala 2.12 or 2.13), 4.0 (Scala 2.13) and 4.1 (Scala 2.13) in release 1.11.0" in message
    assert "pip install a pyspark" in message and "spark.jars.packages" in message
    assert not caught.value.retriable


def test_a_table_of_several_releases_names_each():
    package = LinePackage("a library", "g:lib-{spark_line}_{scala}:{release}",
                          (LineRelease("3.5", "1.0", ("2.12",)), LineRelease("4.0", "2.0", ("2.13",)),
                           LineRelease("4.1", "2.0", ("2.13",))))
    assert package.artifact == "lib"
    assert package.available() == "Spark 3.5 (Scala 2.12) in release 1.0; Spark 4.0 (Scala 2.13) and 4.1 (Scala 2.13) " \
                                  "in release 2.0"
    assert package.coordinates("4.1.0", "2.13") == "g:lib-4.1_2.13:2.0"
    assert (default_scala("3.5.7"), default_scala("4.2.0")) == ("2.12", "2.13")


def test_the_installed_line_without_a_runtime_fails_before_spark_starts(spark_4_2, monkeypatch):
    with pytest.raises(ConfigurationError, match=r"no build for Spark 4\.2 \(the installed pyspark: 4\.2\.0\)"):
        spark_packages.with_connectors({}, [ICEBERG_SPARK_RUNTIME])
    with pytest.raises(ConfigurationError, match="installed pyspark: 4.2.0"):
        spark_packages.check_line_packages({}, [ICEBERG_SPARK_RUNTIME, "org.xerial:sqlite-jdbc:3.50.3.0"])

    def no_driver(*args, **kwargs):
        raise AssertionError("a Spark driver was started")

    monkeypatch.setattr("pyspark.sql.SparkSession.Builder.getOrCreate", no_driver)
    with pytest.raises(ConfigurationError, match="no build for Spark 4.2"):
        in_process_session.build_spark_session("t", {}, packages=[ICEBERG_SPARK_RUNTIME])


@pytest.mark.parametrize("conf", [{"spark.jars.packages": OWN_BUILD},
                                  {"spark.jars": "/jars/iceberg-spark-runtime-4.2_2.13-1.11.0-ours.jar"}])
def test_the_users_own_runtime_wins_on_any_line(spark_4_2, conf):
    spark_packages.check_line_packages(conf, [ICEBERG_SPARK_RUNTIME])
    result = spark_packages.with_connectors(conf, [ICEBERG_SPARK_RUNTIME])
    added = result["spark.jars.packages"].split(",")
    assert added[-1] == spark_packages.kafka_package() and not any("org.apache.iceberg" in p for p in added)


def test_the_users_runtime_in_submit_args_wins_too(spark_4_2, monkeypatch):
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", f"--packages {OWN_BUILD} pyspark-shell")
    spark_packages.check_line_packages({}, [ICEBERG_SPARK_RUNTIME])


def test_the_sinks_declare_their_line_bound_packages():
    assert spec_line_packages(ICEBERG) == (ICEBERG_SPARK_RUNTIME,)
    assert spec_line_packages(PARQUET) == () and spec_line_packages("{{ var.json.sink }}") == ()
    assert spec_line_packages({"type": "{{ var.value.kind }}"}) == ()
    assert ICEBERG_SPARK_RUNTIME in create_writer(ICEBERG).spark_packages()


def test_a_dag_with_an_iceberg_sink_on_a_line_without_a_runtime_fails_to_parse(spark_4_2):
    with pytest.raises(ConfigurationError, match="no build for Spark 4.2"):
        check_packages_at_parse(ICEBERG, None, "fail", None, None)
    with pytest.raises(ConfigurationError, match="no build for Spark 4.2"):
        check_packages_at_parse(PARQUET, ICEBERG, "dead_letter", None, {"spark.executor.cores": "1"})


@pytest.mark.parametrize("dead_letter, policy, spark_conn_id, spark_conf", [
    (None, "fail", "spark_cluster", None),  # spark-submit or Spark Connect: known when the task reads the connection
    (None, "fail", None, {"spark.remote": "sc://spark:15002"}),  # the server's Spark, not the installed one
    (None, "fail", None, {"spark.jars.packages": "{{ var.value.iceberg_runtime }}"}),  # rendered by the task
    (None, "fail", None, "{{ var.json.spark_conf }}"),
    (None, "fail", None, {"spark.jars.packages": OWN_BUILD}),
    (ICEBERG, "fail", None, None),  # a dead-letter destination that is not used
])
def test_what_parsing_leaves_to_the_plan_or_lets_through(spark_4_2, dead_letter, policy, spark_conn_id, spark_conf):
    sink = ICEBERG if dead_letter is None else PARQUET
    check_packages_at_parse(sink, dead_letter, policy, spark_conn_id, spark_conf)


def test_a_spark_connect_servers_line_is_named_in_the_write_error():
    writer = create_writer(ICEBERG)
    assert writer._packages_for("4.1.0")[0] == f"org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:{ICEBERG_RELEASE}"
    missing = writer._packages_for("4.2.0")
    assert len(missing) == 1 and "no build for Spark 4.2 (the write's Spark: 4.2.0)" in missing[0]
    server = SimpleNamespace(version="4.2.0")  # a Spark Connect session's answer, its server's release
    error = writer._explain(RuntimeError("[CATALOG_PLUGIN_CLASS_NOT_FOUND] iceberg"), server)
    assert isinstance(error, ConfigurationError) and "Spark 4.2.0 cannot load Iceberg's Spark runtime" in str(error)
    assert "in release 1.11.0" in str(error)
