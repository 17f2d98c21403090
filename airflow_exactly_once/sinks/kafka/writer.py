"""The Kafka sink's partition writer: one Spark partition's records into one producer, on an executor.

Under EXACTLY_ONCE the producer uses the transactional id (prefix, batch_seq, partition):
`init_transactions()` fences and aborts whatever an earlier attempt of the same partition
left open, then the records go into a new transaction that is flushed and left open
(pre-commit). The partition's `PartitionReport` is its commit message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from kafka import KafkaProducer

from airflow_exactly_once.core.sink import PartitionWriter
from airflow_exactly_once.sinks.kafka.committable import PartitionReport
from airflow_exactly_once.sinks.kafka.transactions import KafkaTransactionError, open_transaction, pre_commit

Record = tuple[bytes | None, bytes | None]  # (key, value)


def transactional_id(prefix: str, batch_seq: int, partition: int) -> str:
    """One id per (pipeline, batch, Spark partition): a retry of the partition fences its predecessor."""
    return f"{prefix}-{batch_seq}-{partition}"


def transactional_id_pattern(prefix: str, batch_seq: int) -> str:
    """A regex that fully matches the transactional ids of every partition of one batch."""
    return re.escape(f"{prefix}-{batch_seq}-") + r"\d+"


class _Acks:
    """Collects the first acknowledged offset per output partition, and any delivery error."""

    def __init__(self) -> None:
        self.first: dict[tuple[str, int], int] = {}
        self.errors: list[BaseException] = []

    def on_success(self, metadata) -> None:
        key = (metadata.topic, metadata.partition)
        if metadata.offset >= 0 and metadata.offset < self.first.get(key, metadata.offset + 1):
            self.first[key] = metadata.offset

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)


def arrow_records(batches: Iterable[Any]) -> Iterator[Record]:
    """(key, value) pairs out of Arrow batches with a `value` and an optional `key` column (both binary)."""
    for batch in batches:
        values = batch.column("value").to_pylist()
        keys = batch.column("key").to_pylist() if "key" in batch.schema.names else [None] * len(values)
        yield from zip(keys, values)


@dataclass(frozen=True)
class KafkaPartitionWriter(PartitionWriter):
    """Everything an executor needs; `producer_config` holds kafka-python arguments (servers, security)."""

    topic: str
    guarantee: str
    transactional_id_prefix: str
    batch_seq: int
    transaction_timeout_ms: int
    producer_config: dict[str, Any] = field(default_factory=dict)
    flush_timeout_s: float = 120.0

    def write(self, partition: int, batches: Iterator[Any]) -> PartitionReport:
        return self.write_records(partition, arrow_records(batches))

    def write_records(self, partition: int, records: Iterable[Record]) -> PartitionReport:
        """Send the records under the pipeline's guarantee; the partition's report."""
        exactly_once = self.guarantee == "EXACTLY_ONCE"
        producer = self._producer(transactional_id(self.transactional_id_prefix, self.batch_seq, partition))
        acks = _Acks()
        count = 0
        handle = None
        try:
            for key, value in records:
                future = producer.send(self.topic, key=key, value=value)
                if self.guarantee != "NONE":
                    future.add_callback(acks.on_success)
                    future.add_errback(acks.on_error)
                count += 1
            if exactly_once:
                handle = pre_commit(producer, timeout_s=self.flush_timeout_s)  # flush + leave the txn open
            else:  # AT_LEAST_ONCE: close() flushes and waits for acks=all; NONE: nothing is awaited (acks=0)
                producer.close(timeout=self.flush_timeout_s)
        except BaseException:
            # Its open transaction is aborted by the driver's cleanup, fenced by the next attempt
            # of this partition, or timed out by the broker.
            producer.close(timeout=0)
            raise
        if acks.errors:
            error = acks.errors[0]
            raise KafkaTransactionError(
                f"{len(acks.errors)} of {count} records of partition {partition} could not be written to "
                f"{self.topic!r}: {type(error).__name__}: {error}",
                retriable=bool(getattr(error, "retriable", False)))
        return PartitionReport(partition, count, tuple((t, p, o) for (t, p), o in sorted(acks.first.items())),
                               handle)

    def _producer(self, tid: str) -> KafkaProducer:
        config = dict(self.producer_config)
        servers = config.pop("bootstrap_servers")
        if self.guarantee == "EXACTLY_ONCE":
            return open_transaction(servers, tid, self.transaction_timeout_ms, **config)
        if self.guarantee == "NONE":
            config.update(acks=0, enable_idempotence=False, retries=0)
        else:
            config.setdefault("acks", "all")
        return KafkaProducer(bootstrap_servers=servers, **config)
