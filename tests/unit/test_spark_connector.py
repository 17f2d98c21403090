"""Where the Kafka connector comes from: the user's own Spark settings first, else Spark's resolution."""

from __future__ import annotations

from airflow_exactly_once.spark import packages as spark_packages


def names_kafka(conf: dict, environ: dict | None = None) -> bool:
    """Whether the user's settings already name Kafka's connector."""
    return spark_packages.names_package(spark_packages.CONNECTOR, conf, environ)


def test_coordinates_follow_the_installed_spark(tmp_path):
    (tmp_path / "jars").mkdir()
    (tmp_path / "jars" / "scala-library-2.12.18.jar").touch()
    assert spark_packages.scala_version(tmp_path) == "2.12"
    assert spark_packages.scala_version(tmp_path / "none", version="3.5.7") == "2.12"
    assert spark_packages.scala_version(tmp_path / "none", version="4.2.0") == "2.13"
    assert spark_packages.kafka_package("3.5.7", "2.12") == "org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.7"
    installed = spark_packages.kafka_package()
    assert installed.endswith(f"_{spark_packages.scala_version()}:{spark_packages.spark_version()}")


def test_the_users_own_settings_win(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    assert not names_kafka({})
    assert names_kafka({"spark.jars": "/jars/spark-sql-kafka-0-10_2.13-4.0.0.jar"})
    assert names_kafka({"spark.jars.packages": spark_packages.kafka_package()})
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0 "
                                              "pyspark-shell")
    assert names_kafka({})
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    (tmp_path / "spark-defaults.conf").write_text("# comment\nspark.driver.memory 2g\n"
                                                  "spark.jars   /a.jar,/b/spark-sql-kafka-0-10_2.13-4.0.0.jar\n")
    assert names_kafka({})
    assert spark_packages.with_connectors({"spark.executor.cores": "1"}) == {"spark.executor.cores": "1"}


def test_without_a_connector_spark_resolves_it_and_skips_the_maven_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    conf = spark_packages.with_connectors({"spark.jars.packages": "org.example:other:1.0"})
    assert conf["spark.jars.packages"] == f"org.example:other:1.0,{spark_packages.kafka_package()}"
    assert conf["spark.jars.ivySettings"] == str(spark_packages.IVY_SETTINGS)
    assert "~/.m2" not in spark_packages.IVY_SETTINGS.read_text().split("-->", 1)[1]
    assert "repository" not in spark_packages.IVY_SETTINGS.read_text().split("-->", 1)[1]
    own = spark_packages.with_connectors({"spark.jars.ivySettings": "/etc/ivy.xml"})
    assert own["spark.jars.ivySettings"] == "/etc/ivy.xml"
