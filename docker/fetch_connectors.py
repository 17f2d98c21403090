"""Bake Spark's connectors into the image: resolve them once with Spark's own resolver, list the jars.

Run at image build time. Spark resolves the coordinates the provider would ask for when a
pipeline names no connector (Kafka's source, spark-avro for Avro values, Iceberg's runtime
and its catalogs' JDBC drivers) into an Ivy folder of the image, and this writes a
spark-defaults.conf whose spark.jars lists the resolved jars, so that write tasks,
spark-submit and the Spark Connect server load them without resolving anything at run time.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import SparkSession

from airflow_exactly_once.sinks.iceberg.catalog import POSTGRES_JDBC_PACKAGE, SQLITE_JDBC_PACKAGE
from airflow_exactly_once.spark.packages import (
    IVY_SETTINGS,
    artifact_of,
    avro_package,
    iceberg_package,
    kafka_package,
)


def main(ivy: str, conf_dir: str) -> None:
    packages = [kafka_package(), avro_package(), iceberg_package(), POSTGRES_JDBC_PACKAGE, SQLITE_JDBC_PACKAGE]
    spark = (SparkSession.builder.master("local[1]").config("spark.jars.packages", ",".join(packages))
             .config("spark.jars.ivy", ivy).config("spark.jars.ivySettings", str(IVY_SETTINGS))
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.stop()
    jars = sorted(str(p) for p in (Path(ivy) / "jars").glob("*.jar"))
    missing = [p for p in packages if not any(artifact_of(p) in Path(jar).name for jar in jars)]
    if missing:
        raise SystemExit(f"Spark did not resolve {', '.join(missing)} into {ivy}")
    Path(conf_dir).mkdir(parents=True, exist_ok=True)
    (Path(conf_dir) / "spark-defaults.conf").write_text(f"spark.jars {','.join(jars)}\n")
    print(f"{len(jars)} connector jars listed in {conf_dir}/spark-defaults.conf")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
