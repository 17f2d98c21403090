"""The DAGs of benchmarks/bench_dag_run.py: Airflow's own no-op DAG, and one small batch in-process and on Spark Connect."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, task

from airflow_exactly_once.task_group import exactly_once_batch

with DAG("bench_noop", schedule=None, start_date=datetime(2024, 1, 1), catchup=False):

    @task
    def first():
        return None

    @task
    def second():
        return None

    @task
    def third():
        return None

    first() >> second() >> third()

for name, spark_conn_id in (("bench_local", None), ("bench_connect", "bench_spark_connect")):
    with DAG(name, schedule=None, start_date=datetime(2024, 1, 1), catchup=False, max_active_runs=1):
        exactly_once_batch(
            pipeline_id=name,
            topics=[os.environ.get("BENCH_TOPIC", "bench")],
            sink={"type": "parquet", "path": os.path.join(os.environ.get("BENCH_OUTPUT", "/tmp/bench-out"), name)},
            transform="bench_transforms:rows",
            spark_conn_id=spark_conn_id,
        )


with DAG("bench_by_hand", schedule=None, start_date=datetime(2024, 1, 1), catchup=False, max_active_runs=1):

    @task
    def by_hand():
        """What a user writes without this provider (at least once): one task asks Kafka for the topic's end
        offsets, starts a local SparkSession, reads from the offsets it stored last time to those ends, applies
        the same transform, appends Parquet, then stores the ends in a file. One Spark job; the same Spark
        settings and Kafka connector as the provider's in-task write."""
        import json
        import time
        from pathlib import Path

        from bench_transforms import rows
        from kafka import KafkaConsumer, TopicPartition
        from pyspark.sql import SparkSession

        from airflow_exactly_once.spark.packages import with_connectors

        output = Path(os.environ.get("BENCH_OUTPUT", "/tmp/bench-out")) / "bench_by_hand"
        stored = output.parent / "bench_by_hand.offsets.json"
        topic, bootstrap = os.environ.get("BENCH_TOPIC", "bench"), os.environ["BENCH_BOOTSTRAP"]
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        ends = {str(tp.partition): end for tp, end in consumer.end_offsets(partitions).items()}
        consumer.close()
        started = time.perf_counter()
        builder = SparkSession.builder.appName("by-hand").master("local[*]")
        for key, value in {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "8",
                           "spark.driver.memory": "1g", **with_connectors({}, ())}.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        session = time.perf_counter() - started
        try:
            starting = stored.read_text() if stored.exists() else "earliest"
            frame = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                     .option("subscribe", topic).option("startingOffsets", starting)
                     .option("endingOffsets", json.dumps({topic: ends})).load())
            rows(frame).write.mode("append").parquet(str(output))
            stored.write_text(json.dumps({topic: ends}))
        finally:
            spark.stop()
        return {"seconds": {"spark_session": round(session, 3), "total": round(time.perf_counter() - started, 3)}}

    by_hand()
