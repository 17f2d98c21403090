"""Transforms of the Spark-cluster test DAG (shipped to the cluster with the write job)."""

from __future__ import annotations

import os
import time
from pathlib import Path

HOLD = "hold-write"  # while this file is in the faults folder, executor tasks wait
STARTED = "write-started"  # written by every executor task that reached the transform: the id of its attempt


def started_attempt(folder: Path, seen: set[str] | frozenset[str] = frozenset()) -> str | None:
    """The attempt (Spark application or Spark Connect session) whose executors last reached the
    transform, unless it is one of `seen`: a dying attempt's executors may still write the marker
    after a test moved on to the next attempt."""
    try:
        attempt = (folder / STARTED).read_text()
    except FileNotFoundError:
        return None
    return attempt if attempt and attempt not in seen else None


def held_rows(df):
    """Key, value and provenance as columns; a Python UDF on the executors that waits while
    <faults>/hold-write exists (at most 120 s), so a test can kill a process mid-write."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    folder = os.environ["AIRFLOW_EXACTLY_ONCE_FAULTS"]
    spark = df.sparkSession
    attempt = getattr(spark, "session_id", None) or spark.conf.get("spark.app.id")  # Connect, else classic

    def hold(value):
        partial = Path(folder, f".{STARTED}.{os.getpid()}")
        partial.write_text(attempt)
        os.replace(partial, Path(folder, STARTED))  # never seen half-written
        deadline = time.monotonic() + 120
        while os.path.exists(os.path.join(folder, HOLD)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return value

    rows = df.selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "topic", "partition", "offset")
    return rows.withColumn("v", F.udf(hold, StringType())(F.col("v")))


def held_key_value(df):
    """`key` and `value` as text (what every sink takes), held on the executors like `held_rows`."""
    rows = held_rows(df)
    return rows.selectExpr("k AS key", "v AS value")
