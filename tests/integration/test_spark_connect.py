"""The write step on a real Spark Connect server: the same protocol, a warm Spark.

The server (devtools.spark_connect) runs in local mode with Spark's Kafka connector; the
write task's process is only a client. Output is read back and compared with the input.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from airflow_exactly_once.core.errors import ConfigurationError, FencedError
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.sources.kafka_offsets import KafkaOffsetSource
from airflow_exactly_once.spark.connect import SESSION_DETAIL, ConnectWrite, SparkConnectUnavailable
from devtools.ports import reserve_port
from devtools.spark_connect import LocalSparkConnectServer
from tests.harness import Pipe, open_ledger, pipeline_config
from tests.helpers import assert_exactly_once, create_topic, produce, read_parquet
from tests.kafka_helpers import read_all


def pipe_for(kafka, tmp_path, name: str, sink: dict, topic: str | None = None, **overrides) -> Pipe:
    config = pipeline_config(name, [topic or name], sink, kafka.bootstrap_servers, **overrides)
    return Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(config.kafka()))


def as_text(df):
    return df.selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")


def slow_text(df):
    """The same, slowly: a Python UDF sleeps per record, so a write can be caught in the middle."""
    from pyspark.sql import functions as F

    @F.udf("string")
    def slowly(value):
        import time as _time

        _time.sleep(0.05)
        return value

    return df.select(F.col("key").cast("string").alias("key"), slowly(F.col("value").cast("string")).alias("value"))


def test_parquet_and_kafka_sinks_write_exactly_once_on_spark_connect(kafka, spark_connect, tmp_path):
    name = f"connect-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    create_topic(kafka.bootstrap_servers, f"{name}-out", partitions=2)
    sent = produce(kafka.bootstrap_servers, name, 300)
    for sink in ({"type": "parquet", "path": str(tmp_path / "out")}, {"type": "kafka", "topic": f"{name}-out"}):
        pipe = pipe_for(kafka, tmp_path, f"{name}-{sink['type']}", sink, topic=name)
        batch = pipe.plan("run-1").batch
        summary = ConnectWrite(pipe.coordinator, spark_connect.url, as_text).run(batch.id)
        assert summary["action"] == "prepared" and summary["output_records"] == 300
        # Spark Connect reports only the outermost observation of a write command (the Parquet sink's).
        assert summary["input_records"] == (None if sink["type"] == "parquet" else 300)
        assert pipe.ledger.get_batch(batch.id).details[SESSION_DETAIL]  # a newer attempt could interrupt it
        pipe.commit(batch.id)
    assert_exactly_once(sent, [row["value"] for row in read_parquet(tmp_path / "out")])
    assert_exactly_once(sent, read_all(kafka.bootstrap_servers, f"{name}-out"))


def test_a_newer_attempt_interrupts_the_older_ones_operations(kafka, spark_connect, tmp_path):
    name = f"connect-fence-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 400)
    pipe = pipe_for(kafka, tmp_path, name, {"type": "parquet", "path": str(tmp_path / "out")})
    batch = pipe.plan("run-1").batch
    outcome: dict = {}

    def older():
        try:
            outcome["older"] = ConnectWrite(pipe.new_coordinator(), spark_connect.url, slow_text).run(batch.id)
        except Exception as exc:
            outcome["older"] = exc

    thread = threading.Thread(target=older)
    thread.start()
    deadline = time.monotonic() + 120
    while SESSION_DETAIL not in pipe.ledger.get_batch(batch.id).details:  # it claimed the batch and is writing
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.2)
    started = time.monotonic()
    newer = ConnectWrite(pipe.new_coordinator(), spark_connect.url, as_text).run(batch.id)
    thread.join(120)
    assert newer["action"] == "prepared"
    assert isinstance(outcome["older"], FencedError), outcome  # interrupted, not finished 400 x 50 ms later
    assert time.monotonic() - started < 20
    pipe.commit(batch.id)
    assert_exactly_once(sent, [row["value"] for row in read_parquet(tmp_path / "out")])


def test_an_unreachable_server_is_a_retriable_error_and_changes_nothing(kafka, tmp_path):
    name = f"connect-down-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    produce(kafka.bootstrap_servers, name, 10)
    pipe = pipe_for(kafka, tmp_path, name, {"type": "parquet", "path": str(tmp_path / "out")})
    batch = pipe.plan("run-1").batch
    url = f"sc://127.0.0.1:{reserve_port()}"
    with pytest.raises(SparkConnectUnavailable) as down:
        ConnectWrite(pipe.coordinator, url, as_text).run(batch.id)
    assert down.value.retriable and url in str(down.value)
    assert pipe.state(batch.id) is BatchState.PLANNED


def test_a_server_without_the_kafka_connector_says_which_package(kafka, tmp_path):
    name = f"connect-nojar-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    produce(kafka.bootstrap_servers, name, 10)
    pipe = pipe_for(kafka, tmp_path, name, {"type": "parquet", "path": str(tmp_path / "out")})
    batch = pipe.plan("run-1").batch
    with LocalSparkConnectServer(tmp_path / "bare", cores=1, with_kafka_connector=False) as bare:
        with pytest.raises(ConfigurationError, match="spark-sql-kafka-0-10") as missing:
            ConnectWrite(pipe.coordinator, bare.url, as_text).run(batch.id)
    assert not missing.value.retriable
    assert pipe.state(batch.id) is BatchState.PLANNED  # the abort task takes it from here


def test_a_restarted_server_does_not_disturb_a_prepared_batch(kafka, spark_connect, tmp_path):
    name = f"connect-restart-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 120)
    pipe = pipe_for(kafka, tmp_path, name, {"type": "parquet", "path": str(tmp_path / "out")},
                    max_records_per_partition=20)
    first = pipe.plan("run-1").batch
    ConnectWrite(pipe.coordinator, spark_connect.url, as_text).run(first.id)
    spark_connect.kill()  # PREPARED: the output is staged, the server (and its sessions) gone
    spark_connect.start()
    pipe.commit(first.id)  # notify_complete needs no Spark
    second = pipe.plan("run-2").batch  # the next batch writes on the restarted server
    ConnectWrite(pipe.coordinator, spark_connect.url, as_text).run(second.id)
    pipe.commit(second.id)
    assert pipe.plan("run-3").action == "empty"
    assert_exactly_once(sent, [row["value"] for row in read_parquet(tmp_path / "out")])
