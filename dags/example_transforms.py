"""Transforms of the example pipelines, in a module of their own so that a spark-submitted
write can import them: a DAG file's functions cannot travel to another process.

The DAG folder is on the Python path of Airflow's tasks; the write task ships this module to
the Spark driver and executors with the job (see docs/cluster.md, "Running the write on a Spark
cluster").
"""

from __future__ import annotations


def parse_events(df):
    """Kafka rows in, typed rows out: JSON value -> columns, plus where each record came from."""
    from pyspark.sql import functions as F

    schema = "id BIGINT, name STRING, amount DOUBLE"
    parsed = F.from_json(F.col("value").cast("string"), schema)
    return df.select(
        parsed["id"].alias("id"),
        parsed["name"].alias("name"),
        parsed["amount"].alias("amount"),
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp").alias("kafka_timestamp"),
    )
