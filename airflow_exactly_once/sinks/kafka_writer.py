"""What one Spark partition of the Kafka sink does, inside an executor.

Each partition gets its own producer. Under EXACTLY_ONCE it uses the transactional id
(prefix, batch_seq, partition): `init_transactions()` fences and aborts whatever an
earlier attempt of the same partition left open, then the records go into a new
transaction that is flushed and left open (pre-commit). The partition returns a small
JSON-able report, the "commit message" that the driver stores in the ledger.

No Airflow here; PySpark only inside `write_arrow_partition` (the executor entry point).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from kafka import KafkaProducer

from airflow_exactly_once.sinks.kafka_transactions import (
    KafkaTransactionError,
    open_transaction,
    pre_commit,
)

log = logging.getLogger(__name__)

Record = tuple[bytes | None, bytes | None]  # (key, value)


@dataclass(frozen=True)
class WriterSettings:
    """Everything an executor needs; pickled into the Spark task."""

    bootstrap_servers: str
    topic: str
    guarantee: str
    transactional_id_prefix: str
    batch_seq: int
    transaction_timeout_ms: int
    producer_config: dict[str, Any] = field(default_factory=dict)
    flush_timeout_s: float = 120.0


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


def write_partition(settings: WriterSettings, partition: int, records: Iterable[Record]) -> dict[str, Any]:
    """Send the records of one partition under the pipeline's guarantee; return its commit message."""
    tid = transactional_id(settings.transactional_id_prefix, settings.batch_seq, partition)
    exactly_once = settings.guarantee == "EXACTLY_ONCE"
    producer = _producer(settings, tid)
    acks = _Acks()
    count = 0
    try:
        for key, value in records:
            future = producer.send(settings.topic, key=key, value=value)
            if settings.guarantee != "NONE":
                future.add_callback(acks.on_success)
                future.add_errback(acks.on_error)
            count += 1
        if exactly_once:
            handle = pre_commit(producer, timeout_s=settings.flush_timeout_s)  # flush + leave the txn open
        elif settings.guarantee == "AT_LEAST_ONCE":
            producer.flush(timeout=settings.flush_timeout_s)
            producer.close(timeout=settings.flush_timeout_s)
        else:  # NONE: nothing is awaited; close() only hands the buffer to the socket (acks=0)
            producer.close(timeout=settings.flush_timeout_s)
    except BaseException:
        _give_up(producer)
        raise
    if acks.errors:
        error = acks.errors[0]
        raise KafkaTransactionError(
            f"{len(acks.errors)} of {count} records of partition {partition} could not be written to "
            f"{settings.topic!r}: {type(error).__name__}: {error}", retriable=bool(getattr(error, "retriable", False)))
    return {
        "partition": partition,
        "records": count,
        "first_offsets": [[t, p, o] for (t, p), o in sorted(acks.first.items())],
        "transaction": handle.to_dict() if exactly_once else None,
    }


def _producer(settings: WriterSettings, tid: str) -> KafkaProducer:
    config = dict(settings.producer_config)
    if settings.guarantee == "EXACTLY_ONCE":
        return open_transaction(settings.bootstrap_servers, tid, settings.transaction_timeout_ms, **config)
    if settings.guarantee == "NONE":
        config.update(acks=0, enable_idempotence=False, retries=0)
    else:
        config.setdefault("acks", "all")
    return KafkaProducer(bootstrap_servers=settings.bootstrap_servers, **config)


def _give_up(producer: KafkaProducer) -> None:
    """A failed partition just closes: its open transaction is aborted by the driver's cleanup,
    fenced by the next attempt of this partition, or timed out by the broker."""
    producer.close(timeout=0)


def write_arrow_partition(settings: WriterSettings, batches: Iterator[Any]) -> Iterator[Any]:
    """`DataFrame.mapInArrow` entry point: (key, value) Arrow batches in, one commit message out.

    A DataFrame action (not `df.rdd`), so the write's Spark Observations (record counts) fire.
    """
    import pyarrow as pa
    from pyspark import TaskContext

    def records() -> Iterator[Record]:
        for batch in batches:
            values = batch.column("value").to_pylist()
            keys = batch.column("key").to_pylist() if "key" in batch.schema.names else [None] * len(values)
            yield from zip(keys, values)

    message = write_partition(settings, TaskContext.get().partitionId(), records())
    yield pa.RecordBatch.from_pydict({"message": [json.dumps(message)]})
