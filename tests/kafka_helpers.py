"""Reading a Kafka output topic completely, under either isolation level.

A read never relies on "nothing arrived for N seconds": it first waits until no
transaction is open on any partition (last stable offset == high watermark), then reads
each partition until the consumer's position reaches that end, so a missing record is a
real absence and not a slow broker.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import NoError
from kafka.structs import OffsetAndMetadata

from airflow_exactly_once.sinks.kafka.committable import KafkaCommittable
from tests.helpers import client_args

Cluster = str | dict[str, Any]  # bootstrap servers, or kafka-python arguments (a secured broker's client_config())


def _ends(bootstrap: Cluster, tps: list[TopicPartition], isolation: str) -> dict[TopicPartition, int]:
    consumer = KafkaConsumer(**client_args(bootstrap), isolation_level=isolation)
    try:
        return consumer.end_offsets(tps)
    finally:
        consumer.close()


def partitions_of(bootstrap: Cluster, topic: str) -> list[TopicPartition]:
    consumer = KafkaConsumer(**client_args(bootstrap))
    try:
        return [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
    finally:
        consumer.close()


def settled_ends(bootstrap: Cluster, topic: str, timeout_s: float = 60.0) -> dict[TopicPartition, int]:
    """End offsets once no transaction is open on the topic; fails if one stays open."""
    tps = partitions_of(bootstrap, topic)
    deadline = time.monotonic() + timeout_s
    while True:
        stable, high = _ends(bootstrap, tps, "read_committed"), _ends(bootstrap, tps, "read_uncommitted")
        if stable == high:
            return high
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic} still has open transactions: stable {stable} < high watermark {high}")
        time.sleep(0.2)


def read_all(bootstrap: Cluster, topic: str, isolation: str = "read_committed", timeout_s: float = 60.0,
             settle: bool = True) -> list[str]:
    """Every value on `topic` visible under `isolation`, once the topic is settled (or, with
    settle=False, what read_committed consumers see right now, open transactions and all)."""
    ends = (settled_ends(bootstrap, topic, timeout_s) if settle
            else _ends(bootstrap, partitions_of(bootstrap, topic), "read_committed"))
    consumer = KafkaConsumer(**client_args(bootstrap), isolation_level=isolation, enable_auto_commit=False,
                             consumer_timeout_ms=500)
    values: list[str] = []
    try:
        consumer.assign([tp for tp, end in ends.items() if end > 0])
        for tp in consumer.assignment():
            consumer.seek(tp, 0)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in consumer.assignment()):
            assert time.monotonic() < deadline, f"reading {topic} as {isolation} stalled"
            for record in consumer:
                if record.offset < ends[TopicPartition(record.topic, record.partition)]:
                    values.append(record.value.decode() if record.value is not None else None)
    finally:
        consumer.close()
    return values


def group_offsets(bootstrap: Cluster, group: str) -> dict[tuple[str, int], int]:
    admin = KafkaAdminClient(**client_args(bootstrap))
    try:
        answer = admin.list_group_offsets({group: None})[group]
    finally:
        admin.close()
    return {(tp.topic, tp.partition): meta.offset for tp, meta in answer.items()}


def alter_group(bootstrap: Cluster, group: str, offsets: dict[tuple[str, int], tuple[int, str]]) -> None:
    """Commit offsets (with metadata) for a group that has no active member, as another consumer would."""
    admin = KafkaAdminClient(**client_args(bootstrap))
    try:
        errors = admin.alter_group_offsets(group, {TopicPartition(t, p): OffsetAndMetadata(o, meta, -1)
                                                   for (t, p), (o, meta) in offsets.items()})
    finally:
        admin.close()
    assert all(err is NoError for err in errors.values()), errors


def delete_group_offset(bootstrap: Cluster, group: str, tp: tuple[str, int]) -> None:
    """Delete one committed offset of a group that has no active member."""
    admin = KafkaAdminClient(**client_args(bootstrap))
    try:
        admin.delete_group_offsets(group, [TopicPartition(*tp)])
    finally:
        admin.close()
    assert tp not in group_offsets(bootstrap, group)


def transaction_state(bootstrap: Cluster, transactional_id: str) -> str:
    admin = KafkaAdminClient(**client_args(bootstrap))
    try:
        return admin.describe_transactions([transactional_id])[transactional_id].state.value
    finally:
        admin.close()


def settled_transaction_state(bootstrap: Cluster, transactional_id: str, timeout_s: float = 30.0) -> str:
    """The transaction's state once the coordinator has finished ending it: an abort or commit is
    acknowledged in PrepareAbort / PrepareCommit, and Complete* follows once the markers are written."""
    deadline = time.monotonic() + timeout_s
    while (state := transaction_state(bootstrap, transactional_id)) in ("PrepareAbort", "PrepareCommit"):
        assert time.monotonic() < deadline, f"{transactional_id} stayed {state} for {timeout_s:.0f}s"
        time.sleep(0.2)
    return state


def wait_transactions_ended(bootstrap: Cluster, committable: Any, timeout_s: float = 60.0) -> None:
    """Wait until the broker has ended (here: timed out) every transaction of a batch's KafkaCommittable
    (or of the handles the ledger stores for it)."""
    if isinstance(committable, dict):
        committable = KafkaCommittable.from_handles(committable)
    tids = [r.transactional_id for r in committable.transactions if r.transaction.started]
    deadline = time.monotonic() + timeout_s
    while any(transaction_state(bootstrap, tid) not in ("CompleteAbort", "CompleteCommit") for tid in tids):
        assert time.monotonic() < deadline, f"the broker never ended {tids}"
        time.sleep(0.5)



def lose_coordinator_state(broker: Any) -> None:
    """A real fault, made deterministic: the broker stopped, its `__transaction_state` logs removed, started
    again (as an unclean election on that topic or a lost disk leaves it). The coordinator forgets every
    transaction; the partitions keep theirs open, with no coordinator to end them."""
    broker.stop()
    folders = list((broker.data_dir / "logs").glob("__transaction_state-*"))
    assert folders, "the broker has no transaction state to lose"
    for folder in folders:
        shutil.rmtree(folder)
    broker.start()
