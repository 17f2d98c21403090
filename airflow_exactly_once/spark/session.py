"""The SparkSession of an in-process write: local[*] by default, with Kafka's connector."""

from __future__ import annotations

import os
import sys
from typing import Any

DEFAULT_MASTER = "local[*]"


def _has_kafka_connector(conf: dict[str, Any]) -> bool:
    return any("spark-sql-kafka" in str(conf.get(key, "")) for key in ("spark.jars", "spark.jars.packages"))


def build_spark_session(app_name: str, spark_conf: dict[str, Any] | None = None, master: str | None = None):
    """A session that can read Kafka. Without connector settings the jars come from Maven."""
    from pyspark.sql import SparkSession

    conf = dict(spark_conf or {})
    if not _has_kafka_connector(conf):
        from airflow_exactly_once.devenv.maven import spark_kafka_jars

        conf["spark.jars"] = ",".join(filter(None, [conf.get("spark.jars", ""), *spark_kafka_jars()]))
    # Python workers must run the interpreter that has this package and the transform.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(master or conf.pop("spark.master", DEFAULT_MASTER))
    defaults = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "8",
        "spark.driver.memory": "1g",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
    }
    for key, value in {**defaults, **conf}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
