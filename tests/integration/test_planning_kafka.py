"""Planning against the real Kafka broker: every startup mode, the ledger winning over it,
partitions added later, and interval boundaries (offsets for times) including late records.

Only the plan step runs here (no Spark): the ranges it fixes are what these tests check;
the end-to-end tests in test_operations_airflow.py write and commit them through Airflow.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from airflow_exactly_once.core.errors import ConfigurationError, IntervalNotOverError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.timestamps import now_ms
from airflow_exactly_once.kafka.offsets import METADATA_REFRESH_GAP_MS, KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from tests.harness import Pipe, open_ledger, pipeline_config

HOUR = 3_600_000
T0 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR  # a whole hour, long past


def make_topic(kafka, name: str, partitions: int = 2) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:  # retention off: the records carry old timestamps on purpose
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs={"retention.ms": "-1"})])
    finally:
        admin.close()


def send(kafka, topic: str, records: list[tuple[int, int]]) -> None:
    """(partition, timestamp ms) per record, in order."""
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    for i, (partition, ts) in enumerate(records):
        producer.send(topic, value=f"v{i}".encode(), partition=partition, timestamp_ms=ts)
    producer.flush()
    producer.close()


def commit_group_offset(kafka, group: str, topic: str, partition: int, offset: int) -> None:
    """What a consumer group that read up to `offset` leaves behind (the group coordinator may need a moment)."""
    from kafka import TopicPartition
    from kafka.errors import CoordinatorNotAvailableError
    from kafka.structs import OffsetAndMetadata

    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        for attempt in range(30):
            try:
                admin.alter_group_offsets(group, {TopicPartition(topic, partition): OffsetAndMetadata(offset, "", -1)})
                return
            except CoordinatorNotAvailableError:
                time.sleep(1)
        raise AssertionError(f"the group coordinator of {group} never became available")
    finally:
        admin.close()


def coordinator(kafka, tmp_path, name: str, ledger: Ledger | None = None, **overrides) -> Pipe:
    config = pipeline_config(name, [name], {"type": "parquet", "path": str(tmp_path / "out")},
                             kafka.bootstrap_servers, **overrides)
    return Pipe(config, ledger or open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)))


def commit_planned(c: Pipe, batch) -> None:
    """Stand in for write + notify_complete (tested end to end elsewhere): only the ledger moves."""
    claimed = c.ledger.claim(batch.id)
    c.ledger.mark_prepared(batch.id, claimed.epoch, {}, batch.offset_span, batch.offset_span)
    c.ledger.mark_committed(batch.id)


def spans(batch) -> dict[int, tuple[int, int]]:
    return {r.partition: (r.start, r.end) for r in batch.ranges}


@pytest.mark.parametrize("mode", ["earliest", "latest", "timestamp", "specific_offsets", "group_offsets"])
def test_startup_modes_and_the_ledger_wins(kafka, tmp_path, unique, mode):
    name = f"startup-{mode.replace('_', '-')}-{unique}"
    make_topic(kafka, name)
    # 10 old records and 10 new ones per partition (old at T0, new at T0 + 1h).
    send(kafka, name, [(i % 2, T0) for i in range(20)] + [(i % 2, T0 + HOUR) for i in range(20)])
    overrides = {"startup_mode": mode}
    if mode == "timestamp":
        overrides["startup_timestamp"] = T0 + HOUR
    if mode == "specific_offsets":
        overrides["startup_offsets"] = {name: {0: 3}}  # partition 1: startup_fallback (earliest)
    if mode == "group_offsets":
        commit_group_offset(kafka, f"group-{unique}", name, 0, 7)
        overrides.update(startup_group_id=f"group-{unique}", startup_fallback="latest")  # partition 1: none
    expected = {"earliest": {0: (0, 20), 1: (0, 20)}, "latest": {0: (20, 20), 1: (20, 20)},
                "timestamp": {0: (10, 20), 1: (10, 20)}, "specific_offsets": {0: (3, 20), 1: (0, 20)},
                "group_offsets": {0: (7, 20), 1: (20, 20)}}[mode]
    c = coordinator(kafka, tmp_path, name, **overrides)
    first = c.plan("run-1")
    assert spans(first.batch) == expected
    origins = {(e["kind"], e["message"].split(" (")[-1]) for e in c.ledger.list_events(name)}
    assert all(kind == "partition-added" for kind, _ in origins)
    if mode == "latest":
        assert first.action == "empty" and first.batch.state is BatchState.EMPTY  # recorded, skipped downstream
    else:
        commit_planned(c, first.batch)
    # The ledger wins: a different startup mode later changes nothing, only new records are planned.
    send(kafka, name, [(0, T0 + 2 * HOUR)] * 3)
    later = coordinator(kafka, tmp_path, name, c.ledger, startup_mode="earliest").plan("run-2")
    assert spans(later.batch) == {0: (expected[0][1], 23), 1: (expected[1][1], 20)}


def test_a_fresh_source_lists_partitions_without_waiting_out_the_metadata_backoff(kafka, tmp_path, unique):
    """kafka-python 3.0 keeps 100 ms between metadata refreshes whatever the client's retry_backoff_ms, and a new
    consumer's bootstrap asks for no topic: listing them then waited 100 ms, half of a plan (kafka.offsets)."""
    name = f"prompt-{unique}"
    make_topic(kafka, name, partitions=3)
    config = pipeline_config(name, [name], {"type": "parquet", "path": str(tmp_path / "out")}, kafka.bootstrap_servers)
    took = []
    for _ in range(3):
        source = KafkaOffsetSource(KafkaSettings.of(config))
        try:
            assert source._consumer._cluster.config["retry_backoff_ms"] == METADATA_REFRESH_GAP_MS
            started = time.perf_counter()
            assert source.partitions([name]) == [(name, 0), (name, 1), (name, 2)]
            took.append(time.perf_counter() - started)
        finally:
            source.close()
    assert min(took) < 0.075, f"listing partitions took {[round(t * 1000) for t in took]} ms (the 100 ms wait?)"


def test_partition_added_between_runs_starts_per_policy(kafka, tmp_path, unique):
    name = f"grow-{unique}"
    make_topic(kafka, name, partitions=1)
    send(kafka, name, [(0, T0)] * 5)
    c = coordinator(kafka, tmp_path, name, new_partition_start="latest")
    commit_planned(c, c.plan("run-1").batch)
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        admin.create_partitions({name: 3})
    finally:
        admin.close()
    send(kafka, name, [(1, T0)] * 4 + [(2, T0)] * 2)
    second = c.plan("run-2").batch
    # new_partition_start="latest": the partitions start where they were when first seen.
    assert spans(second) == {0: (5, 5), 1: (4, 4), 2: (2, 2)}
    assert second.state is BatchState.EMPTY
    added = sorted(e["message"] for e in c.ledger.list_events(name) if e["kind"] == "partition-added")
    assert added[1:] == [f"{name}[1] starts at offset 4 (new partition, latest)",
                         f"{name}[2] starts at offset 2 (new partition, latest)"]


def test_interval_boundaries_tile_with_late_records_and_runs_out_of_order(kafka, tmp_path, unique):
    name = f"intervals-{unique}"
    make_topic(kafka, name, partitions=1)
    # 3 records in hour 0, 2 in hour 1, nothing later yet.
    send(kafka, name, [(0, T0 + 1000), (0, T0 + 2000), (0, T0 + 3000), (0, T0 + HOUR + 1), (0, T0 + HOUR + 2)])
    c = coordinator(kafka, tmp_path, name, range_mode="interval", interval_rerun="noop")
    hour1 = c.plan("run-h1", (T0 + HOUR, T0 + 2 * HOUR)).batch  # the later interval plans first
    assert hour1.ranges == (OffsetRange(name, 0, 3, 5),)  # no record after it yet: ends at the log end
    # A late record of hour 1 arrives after hour 1's end boundary was fixed: it goes to hour 2.
    send(kafka, name, [(0, T0 + HOUR + 3), (0, T0 + 2 * HOUR + 5)])
    hour0 = c.plan("run-h0", (T0, T0 + HOUR)).batch
    hour2 = c.plan("run-h2", (T0 + 2 * HOUR, T0 + 3 * HOUR)).batch
    assert hour0.ranges == (OffsetRange(name, 0, 0, 3),)
    assert hour2.ranges == (OffsetRange(name, 0, 5, 7),)
    assert hour1.state is BatchState.PLANNED  # runs of other intervals are independent: nothing superseded
    assert c.ledger.get_batch(hour1.id).state is BatchState.PLANNED
    # A second run of hour 1 supersedes the first (fencing per interval) and reads the same range.
    again = c.plan("run-h1-manual", (T0 + HOUR, T0 + 2 * HOUR)).batch
    assert again.ranges == hour1.ranges and c.ledger.get_batch(hour1.id).state is BatchState.ABORTED
    commit_planned(c, again)
    noop = c.plan("run-h1-again", (T0 + HOUR, T0 + 2 * HOUR))
    assert noop.action == "already-committed" and noop.batch.id == again.id and not noop.needs_commit
    assert any(e["kind"] == "interval-rerun-noop" for e in c.ledger.list_events(name))
    empty = c.plan("run-h5", (T0 + 5 * HOUR, T0 + 6 * HOUR))
    assert empty.action == "empty" and empty.batch.state is BatchState.EMPTY

    # Bad input is refused with what to change, and the ledger is left as it was.
    before = len(c.ledger.list_batches(name))
    with pytest.raises(ConfigurationError, match="has an empty one .* CronDataIntervalTimetable"):
        c.plan("run-cron", (T0, T0))  # Airflow 3's plain cron schedules give empty intervals
    with pytest.raises(IntervalNotOverError) as not_over:
        c.plan("run-future", (now_ms() - HOUR, now_ms() + HOUR))
    assert not_over.value.retriable
    with pytest.raises(ConfigurationError, match="cannot switch to range_mode='continuation'"):
        coordinator(kafka, tmp_path, name, c.ledger).plan("run-continuation")
    assert len(c.ledger.list_batches(name)) == before
