"""Transforms of the Spark-cluster test DAG (shipped to the cluster with the write job)."""

from __future__ import annotations

import os
import time
from pathlib import Path

HOLD = "hold-write"  # while this file is in the faults folder, executor tasks wait
STARTED = "write-started"  # touched by every executor task that reached the transform


def held_rows(df):
    """Key, value and provenance as columns; a Python UDF on the executors that waits while
    <faults>/hold-write exists (at most 120 s), so a test can kill a process mid-write."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    folder = os.environ["AIRFLOW_EXACTLY_ONCE_FAULTS"]

    def hold(value):
        Path(folder, STARTED).touch()
        deadline = time.monotonic() + 120
        while os.path.exists(os.path.join(folder, HOLD)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return value

    rows = df.selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "topic", "partition", "offset")
    return rows.withColumn("v", F.udf(hold, StringType())(F.col("v")))
