"""topic_pattern against the real broker: one plan reads every matching topic; a topic or partition that appears
later is planned from its earliest offset (recorded in the ledger); a matched topic deleted is data loss; a
pattern matching nothing is refused; and a short pipeline over a pattern (plan, Spark write, notify_complete) that
finds a topic between its batches writes every record exactly once."""

from __future__ import annotations

import json
import re
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer

from airflow_exactly_once.cli.main import main as cli
from airflow_exactly_once.core.errors import ConfigurationError, DataLossError
from airflow_exactly_once.core.startup import DISCOVERED_TOPIC
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from tests.harness import Pipe, open_ledger, pipeline_config
from tests.helpers import assert_exactly_once, assert_ranges_tile, create_topic, produce
from tests.kafka_helpers import read_all
from tests.integration.test_planning_kafka import T0, commit_planned, make_topic, send


def patterned(kafka, tmp_path, prefix: str, **overrides) -> Pipe:
    config = pipeline_config(f"{prefix}p", [], {"type": "parquet", "path": str(tmp_path / prefix)},
                             kafka.bootstrap_servers, topic_pattern=re.escape(prefix) + r"\..*", **overrides)
    return Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)))


def spans(batch) -> dict[tuple[str, int], tuple[int, int]]:
    return {(r.topic, r.partition): (r.start, r.end) for r in batch.ranges}


def wait_listed(kafka, present: set[str], absent: set[str] = frozenset(), timeout_s: float = 30.0) -> None:
    """Until the broker's metadata shows the topics created (and not those deleted): admin calls return first."""
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            listed = consumer.topics()
            if present <= listed and not absent & listed:
                return
            assert time.monotonic() < deadline, f"topics {present} / not {absent} never listed as such: {listed}"
            time.sleep(0.2)
    finally:
        consumer.close()


def test_a_pattern_reads_every_match_and_what_appears_later_from_its_earliest_offset(kafka, tmp_path, unique, capsys):
    prefix = f"orders{unique}"
    eu, us, asia, other = f"{prefix}.eu", f"{prefix}.us", f"{prefix}.asia", f"{prefix}-archive"
    for topic in (eu, us, other):
        make_topic(kafka, topic, partitions=1)
        send(kafka, topic, [(0, T0)] * 3)
    wait_listed(kafka, {eu, us, other})
    # startup_mode="latest" places what exists at the first plan; it does not apply to what the pattern finds later.
    c = patterned(kafka, tmp_path, prefix, startup_mode="latest")
    first = c.plan("run-1").batch
    assert spans(first) == {(eu, 0): (3, 3), (us, 0): (3, 3)} and first.state is BatchState.EMPTY
    send(kafka, eu, [(0, T0)] * 2)
    commit_planned(c, second := c.plan("run-2").batch)
    assert spans(second) == {(eu, 0): (3, 5), (us, 0): (3, 3)}

    make_topic(kafka, asia, partitions=2)  # a new matching topic, with records written before the next plan
    send(kafka, asia, [(0, T0)] * 4 + [(1, T0)] * 1)
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        admin.create_partitions({us: 2})  # a new partition of a topic already read
    finally:
        admin.close()
    send(kafka, us, [(1, T0)] * 2)
    wait_listed(kafka, {asia})
    third = c.plan("run-3").batch
    assert spans(third) == {(eu, 0): (5, 5), (us, 0): (3, 3), (us, 1): (0, 2), (asia, 0): (0, 4), (asia, 1): (0, 1)}
    added = sorted(e["message"] for e in c.ledger.list_events(c.config.pipeline_id) if e["kind"] == "partition-added")
    assert added == sorted([f"{eu}[0] starts at offset 3 (startup mode latest)",
                            f"{us}[0] starts at offset 3 (startup mode latest)",
                            f"{us}[1] starts at offset 0 (new partition, earliest)",
                            f"{asia}[0] starts at offset 0 ({DISCOVERED_TOPIC})",
                            f"{asia}[1] starts at offset 0 ({DISCOVERED_TOPIC})"])
    # The CLI says how each partition started, and which topics a batch read.
    url = str(c.ledger.engine.url)
    capsys.readouterr()
    assert cli(["--ledger-url", url, "--json", "positions", c.config.pipeline_id]) == 0
    started = {(row["topic"], row["partition"]): row["started_by"] for row in json.loads(capsys.readouterr().out)}
    assert started[(asia, 1)] == DISCOVERED_TOPIC and started[(us, 1)] == "new partition, earliest"
    assert cli(["--ledger-url", url, "--json", "show", f"{c.config.pipeline_id}:{third.seq}"]) == 0
    assert json.loads(capsys.readouterr().out)["topics"] == sorted([asia, eu, us])
    assert cli(["--ledger-url", url, "pipelines"]) == 0
    assert f"pattern {c.config.topic_pattern}" in capsys.readouterr().out


def test_a_matched_topic_deleted_is_data_loss_and_a_pattern_matching_nothing_is_refused(kafka, tmp_path, unique):
    prefix = f"gone{unique}"
    kept, deleted = f"{prefix}.kept", f"{prefix}.deleted"
    for topic in (kept, deleted):
        make_topic(kafka, topic, partitions=1)
        send(kafka, topic, [(0, T0)] * 2)
    wait_listed(kafka, {kept, deleted})
    c = patterned(kafka, tmp_path, prefix)
    commit_planned(c, c.plan("run-1").batch)
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        admin.delete_topics([deleted])
    finally:
        admin.close()
    wait_listed(kafka, {kept}, {deleted})
    with pytest.raises(DataLossError, match=re.escape(f"{deleted}[0] had committed offset 2 but no longer exists")):
        c.plan("run-2")
    assert c.ledger.latest_batch_for_run(c.config.pipeline_id, "run-2") is None  # nothing planned

    nothing = patterned(kafka, tmp_path, f"none{unique}")
    with pytest.raises(ConfigurationError, match=f"matches no topic on {re.escape(kafka.bootstrap_servers)}"):
        nothing.plan("run-1")


def tagged_value(df):
    """The output value names its topic: the same value sent to two topics stays two records."""
    return df.selectExpr("key", "concat(topic, ':', CAST(value AS STRING)) AS value")


def test_a_pipeline_over_a_pattern_writes_each_record_once_also_from_a_topic_found_between_batches(
        kafka, spark, tmp_path, unique):
    from airflow_exactly_once.spark.partition_writers import run_partition_writers
    from airflow_exactly_once.spark.write_job import run_write

    prefix = f"once{unique}"
    first, second, found, output = f"{prefix}.a", f"{prefix}.b", f"{prefix}.c", f"{prefix}-out"
    for topic, partitions in ((first, 2), (second, 1), (output, 2)):
        create_topic(kafka.bootstrap_servers, topic, partitions)
    sent = [f"{first}:{v}" for v in produce(kafka.bootstrap_servers, first, 30, 2)]
    sent += [f"{second}:{v}" for v in produce(kafka.bootstrap_servers, second, 10, 1)]
    # local_read_max_records=0: Spark's Kafka source reads the batch, from the planned ranges (`assign`).
    config = pipeline_config(prefix, [], {"type": "kafka", "topic": output}, kafka.bootstrap_servers,
                             topic_pattern=re.escape(prefix) + r"\.[a-z]", local_read_max_records=0)
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)),
                run_writers=run_partition_writers)
    for run in ("run-1", "run-2"):
        batch = pipe.plan(run).batch
        assert run_write(spark, pipe.coordinator, batch.id, transform=tagged_value)["action"] == "prepared"
        assert "COMMITTED" in pipe.commit(batch.id)
        if run == "run-1":
            assert {r.topic for r in batch.ranges} == {first, second}
            create_topic(kafka.bootstrap_servers, found, 3)
            sent += [f"{found}:{v}" for v in produce(kafka.bootstrap_servers, found, 15, 3)]
            sent += [f"{first}:{v}" for v in produce(kafka.bootstrap_servers, first, 6, 2, start=30)]
    assert {r.topic for r in batch.ranges} == {first, second, found}
    assert_exactly_once(sent, read_all(kafka.bootstrap_servers, output))
    assert_ranges_tile(pipe.ledger, prefix)


def test_the_backlog_trigger_counts_a_new_matching_topic_as_waiting_from_its_log_start(kafka, tmp_path, unique):
    from airflow_exactly_once.triggers.backlog import PipelineBacklogTrigger, _Probe

    prefix = f"wake{unique}"
    old, new = f"{prefix}.old", f"{prefix}.new"
    make_topic(kafka, old, partitions=1)
    send(kafka, old, [(0, T0)] * 3)
    wait_listed(kafka, {old})
    c = patterned(kafka, tmp_path, prefix)
    commit_planned(c, c.plan("run-1").batch)
    probe = _Probe(PipelineBacklogTrigger(
        pipeline_id=c.config.pipeline_id, topic_pattern=c.config.topic_pattern, kafka_conn_id=None,
        bootstrap_servers=kafka.bootstrap_servers, ledger_url=str(c.ledger.engine.url), kafka_timeout_ms=3000))
    try:
        assert probe.read(None).waiting == {(old, 0): 0}
        make_topic(kafka, new, partitions=2)
        send(kafka, new, [(0, T0)] * 4 + [(1, T0)])
        wait_listed(kafka, {new})
        assert probe.read(None).waiting == {(old, 0): 0, (new, 0): 4, (new, 1): 1}
    finally:
        probe.close()
