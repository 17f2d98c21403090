"""A small batch read by the write's own process (kafka.range_read) against the real broker: exactly the planned
offsets, read_committed (an aborted transaction inside the range and the commit marker at its end are skipped),
deleted records are data loss, and a batch over the byte budget goes back to Spark's source."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from airflow_exactly_once.core.errors import DataLossError
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.kafka.range_read import read_ranges
from airflow_exactly_once.kafka.settings import KafkaSettings
from tests.harness import pipeline_config
from tests.helpers import create_topic


def settings_for(kafka, topic: str) -> KafkaSettings:
    return KafkaSettings.of(pipeline_config(topic, [topic], {"type": "parquet", "path": "/tmp/unused"},
                                            kafka.bootstrap_servers))


def transactional(kafka, topic: str) -> Producer:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)
    return producer


def last_stable_offsets(kafka, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "range-read-ends",
                         "isolation.level": "read_committed"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    finally:
        consumer.close()


def test_exactly_the_planned_offsets_committed_records_only(kafka):
    topic = f"range-read-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, partitions=2)
    producer = transactional(kafka, topic)
    for batch, commit in ((range(0, 5), True), (range(5, 8), False), (range(8, 12), True)):
        producer.begin_transaction()
        for i in batch:
            producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode(), partition=i % 2)
        producer.flush(30)  # on the broker before the abort: the range holds an aborted transaction's records
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    # partition 0: 0 2 4 [commit] 6 [abort] 8 10 [commit]; partition 1: 1 3 [commit] 5 7 [abort] 9 11 [commit]
    ends = last_stable_offsets(kafka, topic, 2)
    assert ends == {0: 9, 1: 9}, ends  # both ranges end with a commit marker
    ranges = [OffsetRange(topic, 0, 1, ends[0]), OffsetRange(topic, 1, 0, ends[1])]
    rows = read_ranges(settings_for(kafka, topic), "range-read-test", ranges)
    values = sorted(row[1].decode() for row in rows)
    assert values == sorted(f"v{i}" for i in (2, 4, 8, 10, 1, 3, 9, 11))  # offset 0 of partition 0 not planned
    assert all(0 <= row[4] < ends[row[3]] for row in rows)
    assert {row[2] for row in rows} == {topic} and all(row[6] == 0 for row in rows)  # CreateTime, as Spark shows it
    producer.flush()


def test_deleted_records_are_data_loss_and_a_large_batch_goes_back_to_spark(kafka):
    topic = f"range-gone-{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap_servers, topic, partitions=1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(20):
        producer.produce(topic, value=b"x" * 1000, partition=0)
    assert producer.flush(30) == 0
    settings = settings_for(kafka, topic)
    assert read_ranges(settings, "range-read-test", [OffsetRange(topic, 0, 0, 20)], max_bytes=5_000) is None
    assert len(read_ranges(settings, "range-read-test", [OffsetRange(topic, 0, 0, 20)])) == 20
    from confluent_kafka import TopicPartition

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    for future in admin.delete_records([TopicPartition(topic, 0, 10)]).values():
        future.result(30)
    with pytest.raises(DataLossError, match="gone from Kafka"):
        read_ranges(settings, "range-read-test", [OffsetRange(topic, 0, 5, 20)], timeout_s=20)
    for future in admin.delete_topics([topic]).values():  # deleted since planning: data loss too, at once
        future.result(30)
    started = time.monotonic()
    with pytest.raises(DataLossError, match="deleted or recreated since planning"):
        read_ranges(settings, "range-read-test", [OffsetRange(topic, 0, 10, 20)], timeout_s=20)
    assert time.monotonic() - started < 10
