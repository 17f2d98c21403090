"""Bake Spark's Kafka connector into the image: resolve it once with Spark's own resolver, list the jars.

Run at image build time. Spark resolves the coordinates of the installed pyspark (as the
provider does when a pipeline names no connector) into an Ivy folder of the image, and this
writes a spark-defaults.conf whose spark.jars lists the resolved jars, so that write tasks,
spark-submit and the Spark Connect server load them without resolving anything at run time.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark.sql import SparkSession

from airflow_exactly_once.spark.connector import IVY_SETTINGS, kafka_package


def main(ivy: str, conf_dir: str) -> None:
    spark = (SparkSession.builder.master("local[1]").config("spark.jars.packages", kafka_package())
             .config("spark.jars.ivy", ivy).config("spark.jars.ivySettings", str(IVY_SETTINGS))
             .config("spark.ui.enabled", "false").getOrCreate())
    spark.stop()
    jars = sorted(str(p) for p in (Path(ivy) / "jars").glob("*.jar"))
    if not any("spark-sql-kafka-0-10" in jar for jar in jars):
        raise SystemExit(f"Spark did not resolve {kafka_package()} into {ivy}")
    Path(conf_dir).mkdir(parents=True, exist_ok=True)
    (Path(conf_dir) / "spark-defaults.conf").write_text(f"spark.jars {','.join(jars)}\n")
    print(f"{len(jars)} connector jars listed in {conf_dir}/spark-defaults.conf")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
