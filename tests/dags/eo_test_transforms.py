"""Transforms used by the test DAG (importable as `eo_test_transforms` from the DAG folder)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def rows(df):
    """Key, value and provenance as plain columns: lets tests compare output with input."""
    return df.selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "topic", "partition", "offset")


def slow_rows(df):
    """Like rows, but the write takes a while: lets a test overlap two runs."""
    time.sleep(float(os.environ.get("EO_TEST_SLOW_SECONDS", "12")))
    return rows(df)


def kill_spark_once(df):
    """Kills the Spark driver JVM from inside a running Spark task, once per marker file."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    marker = Path(os.environ["AIRFLOW_EXACTLY_ONCE_FAULTS"]) / "kill-spark-jvm"
    if not marker.exists():
        return rows(df)
    jvm_pid = df.sparkSession.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    marker_path = str(marker)

    def passthrough(value):
        if os.path.exists(marker_path):
            try:
                os.remove(marker_path)
            except FileNotFoundError:
                return value
            os.kill(jvm_pid, 9)
        return value

    killer = F.udf(passthrough, StringType())
    return rows(df).withColumn("v", killer(F.col("v")))


def explode(df):
    raise ValueError("bad transform: division by zero in the pricing rule")


def wrong_type(df):
    return df.collect()


def _share(amount):
    return 1000 // amount  # amount 0: ZeroDivisionError, for that record only


def guarded_share(df):
    """Decoded JSON in, `id` and `share` out; a record whose share cannot be computed (guarded_column) or whose
    amount is negative (mark_bad) is marked bad."""
    from airflow_exactly_once.spark.records import guarded_column, mark_bad

    df = guarded_column(df, "share", _share, "long", "amount")
    df = mark_bad(df, "amount < 0", "a negative amount")
    return df.select("id", "share", "_source", "_bad_record")


def guarded_share_as_value(df):
    """guarded_share as a Kafka record: key = id, value = JSON."""
    return guarded_share(df).selectExpr("CAST(id AS STRING) AS key",
                                        "to_json(named_struct('id', id, 'share', share)) AS value",
                                        "_source", "_bad_record")
