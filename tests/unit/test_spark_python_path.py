"""Which jars leave the Python workers' path: those Spark resolved for our connectors, never the user's."""

from __future__ import annotations

from types import SimpleNamespace

from airflow_exactly_once.spark.in_process_session import keep_jars_off_python_path
from airflow_exactly_once.spark.packages import user_adds_packages


def session_with(includes):
    return SimpleNamespace(sparkContext=SimpleNamespace(_python_includes=includes))


def test_resolved_jars_leave_the_python_path_and_python_files_stay():
    includes = ["org.apache.spark_spark-sql-kafka-0-10_2.13-4.0.0.jar", "org.apache.kafka_kafka-clients-3.9.0.jar",
                "transforms.zip", "helpers.py", "mine.jar"]
    spark = session_with(includes)
    assert keep_jars_off_python_path(spark, keep=["/opt/lib/mine.jar"]) == 2
    assert spark.sparkContext._python_includes is includes  # pyspark's own list, changed in place
    assert includes == ["transforms.zip", "helpers.py", "mine.jar"]
    assert keep_jars_off_python_path(spark) == 1 and includes == ["transforms.zip", "helpers.py"]


def test_a_pyspark_without_the_list_is_left_alone():
    assert keep_jars_off_python_path(SimpleNamespace(sparkContext=SimpleNamespace())) == 0


def test_packages_or_python_files_the_user_names_keep_every_jar(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert not user_adds_packages({}, environ={})
    assert not user_adds_packages({"spark.jars.packages": " "}, environ={})
    assert user_adds_packages({"spark.jars.packages": "graphframes:graphframes:0.8.3-spark3.5-s_2.12"}, environ={})
    assert user_adds_packages({}, environ={"PYSPARK_SUBMIT_ARGS": "--packages a:b:1 pyspark-shell"})
    assert user_adds_packages({}, environ={"PYSPARK_SUBMIT_ARGS": "--py-files lib.jar pyspark-shell"})
    assert user_adds_packages({}, environ={"PYSPARK_SUBMIT_ARGS": "--conf spark.jars.packages=a:b:1 pyspark-shell"})
    assert not user_adds_packages({}, environ={"PYSPARK_SUBMIT_ARGS": "--driver-memory 2g pyspark-shell"})
    (tmp_path / "spark-defaults.conf").write_text("spark.jars.packages  a:b:1\n")
    assert user_adds_packages({}, environ={})
