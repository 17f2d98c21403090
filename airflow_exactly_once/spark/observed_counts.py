"""How the write counts records: Spark Observations on its own plan, read back cheaply.

An Observation counts the rows that pass a point of the write's plan while the write runs, so the input and
output counts cost no second read of the range. Two things make that work, kept here apart from the write's
steps (spark.write_job): Spark Connect reports observations only with its plan cache off, and classic
PySpark's Observation.get is slow to read one back.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

_COUNT = "records"  # the metric an Observation of the write counts into (counted, observed_records)


def observe_on_connect(spark) -> None:
    """Make Spark Connect report the write's observations. Its plan cache (Spark 4.0) registers an observation
    with the Analyze request that cached the plan, not with the write that runs it (SPARK-53908, fixed after
    4.0): the write's input and output counts never came back, and every batch with a transform read its range
    a second time to count it. A server that refuses the setting costs that second read only."""
    try:
        spark.conf.set("spark.connect.session.planCache.enabled", "false")
    except Exception as exc:
        log.info("Spark Connect kept its plan cache (%s): counts it does not report are taken again",
                 (str(exc).splitlines() or [""])[0])


def counted(frame, observation):
    """`frame` observed by `observation`, which then holds its number of records (observed_records reads it)."""
    from pyspark.sql import functions as F

    return frame.observe(observation, F.count(F.lit(1)).alias(_COUNT))


def observed_records(observation) -> int | None:
    """The count an Observation of `records` holds after its action; None when Spark reported none.

    Classic PySpark's `Observation.get` copies the metrics' Java map with a Java iterator that ends by
    throwing, and converting that exception costs a noticeable share of the driver's own time in every
    write (docs/benchmarks.md, benchmarks/bench_registry_avro.py). The map's own
    `get` is one call."""
    java = getattr(observation, "_jo", None)  # classic PySpark's org.apache.spark.sql.Observation
    if java is not None:
        value = java.getAsJava().get(_COUNT)
    else:  # Spark Connect's: a Python dict already
        value = observation.get.get(_COUNT)
    return None if value is None else int(value)


def observed_already(observation) -> bool:
    """Whether an action already filled `observation` (Spark keeps the metrics of the first action only)."""
    java = getattr(observation, "_jo", None)  # classic PySpark's org.apache.spark.sql.Observation
    if java is not None:
        return bool(java.future().isCompleted())
    return bool(getattr(observation, "_result", None))  # Spark Connect's: filled by each action that ran it
