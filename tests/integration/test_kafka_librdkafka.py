"""The Kafka sink's data path against the real broker: librdkafka producers whose transactions stay open.

The writers produce with confluent-kafka and must leave their transaction open for
notify_complete, which commits it from another process with the kafka-python adapter.
confluent-kafka's close() aborts an open transaction; releasing the producer does not.
These tests pin both facts and the check that catches a release that ends a transaction.
"""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaAdminClient

from airflow_exactly_once.sinks.kafka import librdkafka
from airflow_exactly_once.sinks.kafka.end_txn import commit_transaction
from tests.helpers import create_topic
from tests.kafka_helpers import read_all, settled_transaction_state, transaction_state


@pytest.fixture
def topic(kafka) -> str:
    name = f"rdk-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap_servers, name, partitions=2)
    return name


def open_producer(kafka, topic: str, tid: str, values: list[str]):
    producer = librdkafka.new_producer({"bootstrap.servers": kafka.bootstrap_servers}, "EXACTLY_ONCE", tid, 60_000)
    producer.init_transactions(60)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value.encode(), value.encode())
    assert producer.flush(30) == 0
    return producer


@pytest.fixture
def admin(kafka):
    client = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    yield client
    client.close()


def test_a_released_producer_leaves_its_transaction_open_for_another_process(kafka, topic, admin):
    tid = f"rdk-{uuid.uuid4().hex[:6]}"
    values = [f"v{i}" for i in range(50)]
    holder = [open_producer(kafka, topic, tid, values)]
    handle = librdkafka.release_keeping_transaction(holder, admin, tid)
    assert holder == [] and transaction_state(kafka.bootstrap_servers, tid) == "Ongoing"
    assert sorted(handle.partitions) == [(topic, 0), (topic, 1)]
    assert read_all(kafka.bootstrap_servers, topic, settle=False) == []  # pre-committed: invisible
    commit_transaction(kafka.bootstrap_servers, handle)  # what notify_complete does
    assert sorted(read_all(kafka.bootstrap_servers, topic)) == sorted(values)


def test_close_would_abort_which_is_why_the_writer_never_calls_it(kafka, topic):
    tid = f"rdk-{uuid.uuid4().hex[:6]}"
    open_producer(kafka, topic, tid, ["x"]).close()
    assert settled_transaction_state(kafka.bootstrap_servers, tid) == "CompleteAbort"


def test_a_release_that_ends_the_transaction_is_reported(kafka, topic, admin):
    class EndingRelease(list):
        """What a confluent-kafka that aborts on release would do."""

        def clear(self) -> None:
            self[0].abort_transaction(30)
            super().clear()

    tid = f"rdk-{uuid.uuid4().hex[:6]}"
    with pytest.raises(librdkafka.ReleaseEndedTransaction) as ended:
        librdkafka.release_keeping_transaction(EndingRelease([open_producer(kafka, topic, tid, ["y"])]),
                                               admin, tid)
    assert "Install confluent-kafka==" in str(ended.value) and not ended.value.retriable

