"""The write step on a real Spark Connect server: the same protocol, a warm Spark.

The server (devtools.spark_connect) runs in local mode with Spark's Kafka connector; the
write task's process is only a client. Output is read back and compared with the input.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from functools import partial
from pathlib import Path

import pytest

from airflow_exactly_once.core.errors import ConfigurationError, FencedError
from airflow_exactly_once.core.faults import ENV as FAULTS_ENV
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks.iceberg.table_committer import TableCommitter
from airflow_exactly_once.sinks.kafka import probe
from airflow_exactly_once.spark.connect_server.session import TAG_DETAIL, close_session, open_session, session_url
from airflow_exactly_once.spark.connect_server.stop import stop_batch_attempts
from airflow_exactly_once.spark.launch.connect import SESSION_DETAIL, ConnectWrite, SparkConnectUnavailable
from airflow_exactly_once.spark.batch_read import read_batch
from devtools.ports import reserve_port
from devtools.spark_connect import LocalSparkConnectServer
from tests.dags.eo_cluster_transforms import HOLD, started_attempt
from tests.harness import Pipe, open_ledger, pipeline_config
from tests.helpers import assert_exactly_once, create_topic, produce, read_parquet, staging_leftovers, wait_for
from tests.kafka_helpers import read_all, settled_ends

REPO = Path(__file__).resolve().parents[2]
# A write task's process, as the write operator runs it on a Spark Connect server: killed mid-job by the tests.
WRITE_TASK = """
import json, sys
from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.sinks import pipeline_committer
from airflow_exactly_once.spark.launch.connect import ConnectWrite
from tests.harness import open_ledger

config = PipelineConfig.from_dict(json.loads(sys.argv[1]))
coordinator = BatchCoordinator(config, open_ledger(sys.argv[2]), pipeline_committer(config))
write = ConnectWrite(coordinator, sys.argv[3], "tests.dags.eo_cluster_transforms:held_key_value")
write.run(BatchId.parse(sys.argv[4]))
"""


def pipe_for(kafka, tmp_path, name: str, sink: dict, topic: str | None = None, **overrides) -> Pipe:
    config = pipeline_config(name, [topic or name], sink, kafka.bootstrap_servers, **overrides)
    return Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)))


def as_text(df):
    return df.selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")


def every_third(df):
    """The records whose key is a multiple of 3 (keys are 0, 1, 2, ...)."""
    return as_text(df).where("CAST(key AS INT) % 3 = 0")


def slow_text(df, seconds_per_record: float = 0.1):
    """The same, slowly: a Python UDF sleeps per record, so a write can be caught in the middle."""
    from pyspark.sql import functions as F

    @F.udf("string")
    def slowly(value):
        import time as _time

        _time.sleep(seconds_per_record)
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
        assert summary["input_records"] == 300
        assert pipe.ledger.get_batch(batch.id).details[SESSION_DETAIL]  # a newer attempt could interrupt it
        pipe.commit(batch.id)
    assert_exactly_once(sent, [row["value"] for row in read_parquet(tmp_path / "out")])
    assert_exactly_once(sent, read_all(kafka.bootstrap_servers, f"{name}-out"))


@pytest.mark.parametrize("local_read_max_records", [0, 5000], ids=["spark-source", "read-by-the-write"])
def test_a_transform_that_filters_gets_both_counts_from_the_writes_observations(
        kafka, spark_connect, tmp_path, monkeypatch, local_read_max_records):
    """Spark Connect reports the observations of a write command (with its plan cache off: SPARK-53908), the
    input's and the output's: the range is read once. A small batch read by the write counts its input as it
    reads it (no Observation of the input), and is not read a second time either."""
    from airflow_exactly_once.spark import write_job

    reads = []  # the write's reads: spark.batch_read.read_batch, under the name the write calls it by
    monkeypatch.setattr(write_job, "read_batch", lambda *args, **kwargs: reads.append(1) or read_batch(*args, **kwargs))
    name = f"connect-filter-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 90)
    pipe = pipe_for(kafka, tmp_path, name, {"type": "parquet", "path": str(tmp_path / "out")},
                    local_read_max_records=local_read_max_records)
    batch = pipe.plan("run-1").batch
    summary = ConnectWrite(pipe.coordinator, spark_connect.url, every_third).run(batch.id)
    assert (summary["input_records"], summary["output_records"]) == (90, 30)
    assert len(reads) == 1  # no second read to count the input
    pipe.commit(batch.id)
    assert sorted(row["value"] for row in read_parquet(tmp_path / "out")) == sorted(sent[::3])


def test_without_a_transform_the_input_count_on_spark_connect_needs_no_second_read(kafka, spark_connect, tmp_path):
    name = f"connect-plain-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 60)
    pipe = pipe_for(kafka, tmp_path, name, {"type": "parquet", "path": str(tmp_path / "out")},
                    value_format="string")
    batch = pipe.plan("run-1").batch
    summary = ConnectWrite(pipe.coordinator, spark_connect.url, None).run(batch.id)
    assert (summary["input_records"], summary["output_records"]) == (60, 60)
    pipe.commit(batch.id)
    assert_exactly_once(sent, [row["value"] for row in read_parquet(tmp_path / "out")])


def test_decoded_records_and_bad_ones_on_spark_connect(kafka, spark_connect, tmp_path):
    """value_format="json" on Spark Connect: a batch without bad records is written in one pass and counted by its
    observations; in a batch with bad ones the one-pass write stops at the first, and the policy path writes the
    good records and the dead letters, committed together."""
    from kafka import KafkaProducer

    name = f"connect-json-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    out = tmp_path / "out"
    pipe = pipe_for(kafka, tmp_path, name, {"type": "parquet", "path": str(out)}, value_format="json",
                    value_schema="id BIGINT, name STRING, amount DOUBLE", bad_record_policy="dead_letter")
    produce(kafka.bootstrap_servers, name, 20, json_values=True)
    first = pipe.plan("run-1").batch
    summary = ConnectWrite(pipe.coordinator, spark_connect.url, None).run(first.id)
    assert (summary["input_records"], summary["output_records"]) == (20, 20) and "bad_records" not in summary
    pipe.commit(first.id)

    produce(kafka.bootstrap_servers, name, 10, start=20, json_values=True)
    bad = [b'{"id": 30, "name"', b'{"id": "x", "name": "y", "amount": 1}']
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    for value in bad:
        producer.send(name, value=value, partition=1)
    producer.flush()
    producer.close()
    second = pipe.plan("run-2").batch
    summary = ConnectWrite(pipe.coordinator, spark_connect.url, None).run(second.id)
    assert (summary["input_records"], summary["output_records"], summary["bad_records"]) == (12, 10, 2)
    pipe.commit(second.id)
    assert sorted(row["id"] for row in read_parquet(out)) == list(range(30))
    letters = read_parquet(out / "_dead_letter")
    assert sorted(letter["value"] for letter in letters) == sorted(bad)
    assert all("not JSON matching value_schema" in letter["error"] for letter in letters)
    assert staging_leftovers(out) == []


def test_a_pipelines_writes_share_a_session_and_a_newer_attempt_stops_only_the_older_ones_operations(
        kafka, spark_connect, tmp_path):
    """Batch 2 writes in the session batch 1 used (its Python workers are warm); a newer attempt of batch 2
    interrupts the older attempt's operations by its tag, not another client's job in the same session; a session
    the server closed is replaced by a new one."""
    name = f"connect-fence-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 20)
    pipe = pipe_for(kafka, tmp_path, name, {"type": "parquet", "path": str(tmp_path / "out")})
    first = pipe.plan("run-1").batch
    ConnectWrite(pipe.coordinator, spark_connect.url, as_text).run(first.id)
    pipe.commit(first.id)
    shared = pipe.ledger.get_batch(first.id).details
    sent += produce(kafka.bootstrap_servers, name, 400, start=20)
    batch = pipe.plan("run-2").batch
    outcome: dict = {}

    def older():  # uninterrupted: 400 records x 0.5 s on local[2], 100 s
        try:
            outcome["older"] = ConnectWrite(pipe.new_coordinator(), spark_connect.url,
                                            lambda df: slow_text(df, 0.5)).run(batch.id)
        except Exception as exc:
            outcome["older"] = exc
        outcome["older_ended"] = time.monotonic()

    thread = threading.Thread(target=older)
    thread.start()
    deadline = time.monotonic() + 120
    while TAG_DETAIL not in pipe.ledger.get_batch(batch.id).details:  # it claimed the batch and is writing
        assert time.monotonic() < deadline and thread.is_alive(), outcome
        time.sleep(0.2)
    older_details = pipe.ledger.get_batch(batch.id).details
    assert older_details[SESSION_DETAIL] == shared[SESSION_DETAIL]  # the pipeline's session, reused
    assert older_details[TAG_DETAIL] != shared[TAG_DETAIL]
    bystander = open_session(session_url(spark_connect.url, shared[SESSION_DETAIL]))
    beside: dict = {}

    def other_job():  # another client's job in the same session, with a tag of its own
        bystander.addTag("bystander")
        try:
            beside["rows"] = len(slow_text(bystander.range(40).selectExpr("id AS key", "id AS value")).collect())
        except Exception as exc:
            beside["rows"] = exc

    other = threading.Thread(target=other_job)
    other.start()
    started = time.monotonic()
    newer = ConnectWrite(pipe.new_coordinator(), spark_connect.url, as_text).run(batch.id)
    thread.join(240)
    other.join(120)
    assert newer["action"] == "prepared"
    assert isinstance(outcome["older"], FencedError), outcome
    # interrupted when the newer attempt claimed the batch, not ended by its slow job 100 s after it began (half
    # of that is room for a slow machine: CI once took 38 s for the newer attempt's whole write)
    assert outcome["older_ended"] - started < 50, outcome["older_ended"] - started
    assert beside["rows"] == 40, beside  # not interrupted with the older attempt
    newer_details = pipe.ledger.get_batch(batch.id).details
    assert newer_details[SESSION_DETAIL] == shared[SESSION_DETAIL]
    assert newer_details[TAG_DETAIL] not in (older_details[TAG_DETAIL], shared[TAG_DETAIL])
    pipe.commit(batch.id)

    close_session(bystander)  # releases the shared session: the server closes it for good
    sent += produce(kafka.bootstrap_servers, name, 10, start=420)
    third = pipe.plan("run-3").batch
    assert ConnectWrite(pipe.coordinator, spark_connect.url, as_text).run(third.id)["action"] == "prepared"
    assert pipe.ledger.get_batch(third.id).details[SESSION_DETAIL] != shared[SESSION_DETAIL]  # a new one
    pipe.commit(third.id)
    assert_exactly_once(sent, [row["value"] for row in read_parquet(tmp_path / "out")])


def through_a_temp_view(df):
    """A transform that registers the batch as a temporary view: in a session an earlier batch used, the view exists
    already and createTempView fails (what spark_connect_session='attempt' is for)."""
    as_text(df).createTempView("batch_rows")
    return df.sparkSession.sql("SELECT key, value FROM batch_rows")


def test_with_a_session_per_attempt_each_write_starts_clean_and_releases_its_session(kafka, spark_connect, tmp_path):
    """spark_connect_session='attempt': each batch's write opens a session of its own (a transform that creates a
    temporary view works batch after batch), records it without a tag, and releases it when done."""
    name = f"connect-attempt-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    create_topic(kafka.bootstrap_servers, f"{name}-out", partitions=2)
    pipe = pipe_for(kafka, tmp_path, name, {"type": "kafka", "topic": f"{name}-out"})
    sent, sessions = [], []
    for run in range(2):
        sent += produce(kafka.bootstrap_servers, name, 50, start=50 * run)
        batch = pipe.plan(f"run-{run}").batch
        summary = ConnectWrite(pipe.coordinator, spark_connect.url, through_a_temp_view, share_session=False).run(
            batch.id)
        assert summary["action"] == "prepared" and summary["output_records"] == 50
        details = pipe.ledger.get_batch(batch.id).details
        assert details[TAG_DETAIL] is None  # its own session: a newer attempt releases it, no tag needed
        sessions.append(details[SESSION_DETAIL])
        pipe.commit(batch.id)
    assert sessions[0] != sessions[1]
    released = open_session(session_url(spark_connect.url, sessions[0]))
    with pytest.raises(Exception, match="SESSION_CLOSED"):
        released.range(1).collect()
    close_session(released, release=False)
    assert_exactly_once(sent, read_all(kafka.bootstrap_servers, f"{name}-out"))


def test_an_unreachable_server_is_a_retriable_error_and_changes_nothing(kafka, tmp_path):
    name = f"connect-down-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    produce(kafka.bootstrap_servers, name, 10)
    pipe = pipe_for(kafka, tmp_path, name, {"type": "parquet", "path": str(tmp_path / "out")})
    batch = pipe.plan("run-1").batch
    url = f"sc://127.0.0.1:{reserve_port()}"
    started = time.monotonic()
    with pytest.raises(SparkConnectUnavailable) as down:
        ConnectWrite(pipe.coordinator, url, as_text).run(batch.id)
    elapsed = time.monotonic() - started
    assert down.value.retriable and url in str(down.value)
    assert elapsed < 45, f"docs/cluster.md says about half a minute; it took {elapsed:.0f} s"  # pyspark's own: minutes
    assert pipe.state(batch.id) is BatchState.PLANNED


def test_a_server_without_the_kafka_connector_says_which_package(kafka, tmp_path):
    name = f"connect-nojar-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    produce(kafka.bootstrap_servers, name, 10)
    pipe = pipe_for(kafka, tmp_path, name, {"type": "parquet", "path": str(tmp_path / "out")},
                    local_read_max_records=0)  # a small batch, read by the write itself, would need no connector
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


def sink_for(kind: str, name: str, tmp_path) -> dict:
    if kind == "kafka":
        return {"type": "kafka", "topic": f"{name}-out"}
    if kind == "parquet":
        return {"type": "parquet", "path": str(tmp_path / "out")}
    return {"type": "iceberg", "table": f"db.t_{name[-6:]}", "warehouse": str(tmp_path / "lake"),
            "catalog": {"name": f"c{name[-6:]}"}, "create_table": True}


def staged_leftovers(kind: str, pipe: Pipe, kafka, name: str, seq: int, tmp_path) -> list:
    """What the batch `seq` still has staged: open transactions (and a held-back last stable offset), staging
    folders, staged snapshots."""
    if kind == "kafka":
        settings = pipe.sink.output.client_settings()
        with probe.admin_client(settings) as admin:
            known = probe.matching_transactions(admin, settings, pipe.sink.output.naming.batch_pattern(seq))
        settled_ends(kafka.bootstrap_servers, f"{name}-out", timeout_s=1)  # fails if a transaction holds the LSO
        return sorted(tid for tid, state in known.items() if state not in ("CompleteAbort", "Empty", "Dead"))
    if kind == "parquet":
        return staging_leftovers(tmp_path / "out")
    table = pipe.sink.target.table_committer.load()
    main = {s.snapshot_id for s in TableCommitter.main_history(table)} if table.current_snapshot() else set()
    return [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id not in main]


def output_values(kind: str, pipe: Pipe, kafka, name: str, tmp_path) -> list[str]:
    """What a reader sees now: read_committed for Kafka, without waiting for open transactions to end."""
    if kind == "kafka":
        return read_all(kafka.bootstrap_servers, f"{name}-out", settle=False, timeout_s=10)
    if kind == "parquet":
        return [row["value"] for row in read_parquet(tmp_path / "out")]
    return pipe.sink.target.table_committer.load().scan().to_arrow().column("value").to_pylist()


@pytest.mark.parametrize("kind", ["kafka", "parquet", "iceberg"])
def test_abort_stops_a_killed_writes_job_on_the_server_before_releasing_its_output(kind, kafka, spark_connect,
                                                                                   tmp_path):
    """Issue 30: the write's last try is SIGKILLed while its job runs on the server; abort (retries exhausted)
    must stop that job before it cleans up, or the job finishes later and leaves an open transaction holding
    the output's last stable offset, a staging folder, or a staged snapshot."""
    name = f"connect-zombie-{kind}-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    if kind == "kafka":
        create_topic(kafka.bootstrap_servers, f"{name}-out")
    sent = produce(kafka.bootstrap_servers, name, 90)
    pipe = pipe_for(kafka, tmp_path, name, sink_for(kind, name, tmp_path))
    first = pipe.plan("run-1").batch
    faults = tmp_path / "faults"
    faults.mkdir()
    (faults / HOLD).touch()  # the server's workers wait inside the write while it exists
    task = subprocess.Popen([sys.executable, "-c", WRITE_TASK, json.dumps(pipe.config.to_stored_dict()),
                             str(tmp_path / "ledger.db"), spark_connect.url, str(first.id)],
                            cwd=REPO, env={**os.environ, FAULTS_ENV: str(faults)})
    try:
        wait_for(lambda: started_attempt(faults) or task.poll() is not None, "the job to reach the transform", 120)
        assert task.poll() is None, "the write task ended before its job was held"
    finally:
        task.send_signal(signal.SIGKILL)
        task.wait()

    aborting = pipe.new_coordinator()
    aborting.stop_attempts = partial(stop_batch_attempts, spark_connect.url)  # what the abort task is given
    message = aborting.abort(first.id, "the write's last try was killed")
    assert re.search(r"stopped 1 operation\(s\)", message), message  # the write's job
    (faults / HOLD).unlink()  # a job that outlived the abort would finish its write now
    time.sleep(5)  # (proving an absence) what it would stage takes a second or two
    assert staged_leftovers(kind, pipe, kafka, name, first.seq, tmp_path) == []
    assert pipe.ledger.pending_releases(name) == []

    second = pipe.plan("run-2").batch
    assert second.ranges == first.ranges
    ConnectWrite(pipe.coordinator, spark_connect.url, as_text).run(second.id)
    pipe.commit(second.id)
    committed = pipe.ledger.get_batch(second.id)
    assert (committed.input_records, committed.output_records) == (90, 90)  # counts on Spark Connect, every sink
    assert_exactly_once(sent, output_values(kind, pipe, kafka, name, tmp_path))  # visible at once
    assert staged_leftovers(kind, pipe, kafka, name, first.seq, tmp_path) == []


def test_a_server_killed_mid_write_says_it_cannot_be_reached(kafka, spark_connect, tmp_path):
    """The error names the server and its real cause, not only RETRIES_EXCEEDED; the batch stays PLANNED."""
    name = f"connect-dies-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, name)
    produce(kafka.bootstrap_servers, name, 30)
    pipe = pipe_for(kafka, tmp_path, name, {"type": "parquet", "path": str(tmp_path / "out")})
    batch = pipe.plan("run-1").batch
    outcome: dict = {}

    def write():
        try:
            ConnectWrite(pipe.new_coordinator(), spark_connect.url, slow_text).run(batch.id)
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=write)
    thread.start()
    try:
        wait_for(lambda: SESSION_DETAIL in pipe.ledger.get_batch(batch.id).details, "the write to claim the batch")
        time.sleep(1)  # into the job (30 records x 100 ms)
        spark_connect.kill()
        thread.join(120)
    finally:
        if spark_connect.process is None:
            spark_connect.start()
    error = outcome["error"]
    assert isinstance(error, SparkConnectUnavailable) and error.retriable, repr(error)
    assert f"127.0.0.1:{spark_connect.port}" in str(error) and "cannot be reached" in str(error), str(error)
    assert error.__cause__ is not None and error.__cause__ is not error
    assert pipe.state(batch.id) is BatchState.PLANNED
