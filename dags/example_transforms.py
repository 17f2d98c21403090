"""Transforms of the example pipelines, in a module of their own so that a spark-submitted
write can import them: a DAG file's functions cannot travel to another process.

The DAG folder is on the Python path of Airflow's tasks; the write task ships this module to
the Spark driver and executors with the job (see docs/cluster.md, "Running the write on a Spark
cluster").
"""

from __future__ import annotations

# The events' JSON, as the pipelines' `value_schema`: the provider decodes each value strictly, so a
# malformed record is a bad record (failed, dead-lettered or skipped by `bad_record_policy`), never a
# row of nulls as a transform's own `from_json` would make it.
EVENT_SCHEMA = "id BIGINT, name STRING, amount DOUBLE"


def select_events(df):
    """Decoded events in (value_format="json", value_schema=EVENT_SCHEMA), typed rows out, plus where
    each record came from."""
    from pyspark.sql import functions as F

    return df.select(
        F.col("id"),
        F.col("name"),
        F.col("amount"),
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp").alias("kafka_timestamp"),
    )


def select_events_by_day(df):
    """select_events plus the day each record was written to Kafka: the column a lakehouse table is partitioned
    by (dags/kafka_to_delta.py)."""
    from pyspark.sql import functions as F

    events = select_events(df)
    return events.withColumn("day", F.to_date("kafka_timestamp"))
