"""Transforms of the Kafka-sink test DAGs (importable as `eo_kafka_transforms` from the DAG folder)."""

from __future__ import annotations


def upper_value(df):
    """Same key, value upper-cased: the output of record "value-7" is "VALUE-7", so tests can match them."""
    return df.selectExpr("key", "upper(CAST(value AS STRING)) AS value")
