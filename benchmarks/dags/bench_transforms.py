"""Transforms of the benchmark DAGs (a module of the DAG folder, so a Spark Connect session can import it)."""


def rows(df):
    return df.selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v", "partition", "offset")


def key_value(df):
    """Records as they came, for a Kafka sink (bench_celery_dags.py)."""
    return df.selectExpr("key", "value")
