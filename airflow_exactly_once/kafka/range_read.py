"""A small batch's offset ranges read by the process that runs the write, instead of Spark's Kafka source.

On a warm Spark Connect server, Spark's Kafka source spent most of a small write's time (an admin
client per query to check the offsets, then a consumer per partition in the tasks) against a query that
writes the same rows from a local relation (docs/benchmarks.md). A batch of at most `local_read_max_records` offsets (a
pipeline setting, 50,000 by default) is read here with librdkafka instead, exactly as Spark's source reads
it (read_committed, the planned offsets and nothing else, a missing record or partition is data loss),
and handed to Spark as a local relation. When its records turn out larger than MAX_BYTES, None sends the
batch to Spark's source after all.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

try:
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    HAS_CONFLUENT_KAFKA = True
except ImportError:  # a Spark cluster's driver may lack it: Spark's Kafka source reads the batch there
    HAS_CONFLUENT_KAFKA = False

from airflow_exactly_once.core.errors import ConfigurationError, DataLossError, SourceUnavailableError
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.kafka.access import diagnose, explain_refusal
from airflow_exactly_once.kafka.settings import KafkaSettings

MAX_BYTES = 32 << 20  # a local relation travels in the plan: Spark Connect caches larger ones as artifacts
TIMEOUT_S = 60.0
STALL_S = 2.0  # no record for this long: check that the topics and partitions still exist (librdkafka only waits)
# Kafka's timestamp types as Spark's source shows them (confluent-kafka: 0 none, 1 create, 2 log append).
_TIMESTAMP_TYPE = {0: -1, 1: 0, 2: 1}

Row = tuple[Any, Any, str, int, int, int, int]  # key, value, topic, partition, offset, timestamp ms, type


def read_ranges(settings: KafkaSettings, group: str, ranges: Sequence[OffsetRange], max_bytes: int = MAX_BYTES,
                timeout_s: float = TIMEOUT_S) -> list[Row] | None:
    """Every record in `ranges` (read_committed) by topic, partition and offset, as Spark's source lists them, or
    None when they hold more than `max_bytes` or confluent-kafka is missing here (a cluster's driver may lack it:
    Spark's source reads the batch)."""
    if not HAS_CONFLUENT_KAFKA:
        return None
    pending = {(r.topic, r.partition): r for r in ranges if r.size > 0}
    if not pending:
        return []
    client_errors: list[Any] = []  # a refused login or certificate reaches error_cb, never consume()
    consumer = Consumer({**settings.librdkafka(), "group.id": group, "enable.auto.commit": False,
                         "enable.auto.offset.store": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True, "auto.offset.reset": "error", "fetch.wait.max.ms": 10,
                         "error_cb": client_errors.append})
    rows: list[Row] = []
    size = 0
    try:
        consumer.assign([TopicPartition(topic, partition, r.start) for (topic, partition), r in pending.items()])
        deadline = time.monotonic() + timeout_s
        checked = time.monotonic()
        while pending:
            if time.monotonic() - checked > STALL_S:
                _check_partitions_exist(consumer, pending)
                checked = time.monotonic()
            if time.monotonic() > deadline:
                late = ", ".join(f"{t}[{p}] {r.start}..{r.end}" for (t, p), r in sorted(pending.items()))
                diagnosis = diagnose(settings)  # a listener that does not match security.protocol only times out
                raise diagnosis.error or SourceUnavailableError(
                    f"Kafka did not return the records of {late} within {timeout_s:.0f}s (now: {diagnosis.detail}); "
                    "the batch is retried and reads the same records")
            messages = consumer.consume(num_messages=1000, timeout=0.02)  # returns at 1000 or at the timeout
            while client_errors:
                _raise_for(client_errors.pop(0), None, None, settings, ranges)
            if messages:
                checked = time.monotonic()
            for message in messages:
                topic, partition, offset = message.topic(), message.partition(), message.offset()
                error = message.error()
                if topic is None or partition is None or offset is None:  # a client-wide error, of no partition
                    if error is not None:
                        _raise_for(error, None, None, settings, ranges)
                    continue
                where = (topic, partition)
                wanted = pending.get(where)
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if wanted is not None and offset >= wanted.end:  # control records at the end
                            del pending[where]
                        continue
                    _raise_for(error, where, wanted, settings, ranges)
                    continue
                if wanted is None or offset < wanted.start:
                    continue
                if offset >= wanted.end:
                    del pending[where]
                    continue
                key, value = message.key(), message.value()
                kind, stamp = message.timestamp()
                rows.append((key, value, topic, partition, offset, stamp,
                             _TIMESTAMP_TYPE.get(kind, -1)))
                size += len(key or b"") + len(value or b"")
                if size > max_bytes:
                    return None
                if offset == wanted.end - 1:
                    del pending[where]
        rows.sort(key=lambda row: row[2:5])  # partitions arrive interleaved
        return rows
    finally:
        consumer.close()


def _check_partitions_exist(consumer: Any, pending: dict[tuple[str, int], OffsetRange]) -> None:
    """A DataLossError when a pending partition's topic is gone (deleted since planning, perhaps recreated with
    fewer partitions); Kafka down or slow only raises at the read's deadline."""
    for topic in sorted({t for t, _ in pending}):
        try:
            metadata = consumer.list_topics(topic, timeout=5).topics.get(topic)
        except Exception:  # KafkaException: the broker did not answer in time; the deadline decides
            return
        missing = metadata is None or (metadata.error is not None
                                       and metadata.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART)
        if not missing and metadata.error is not None:  # e.g. no leader yet: transient, the deadline decides
            continue
        for (name, partition), r in pending.items():
            if name == topic and (missing or partition not in metadata.partitions):
                raise _data_loss((topic, partition), r, "the topic has no such partition now")


def _raise_for(error: Any, where: tuple[str, int] | None, wanted: OffsetRange | None, settings: KafkaSettings,
               ranges: Sequence[OffsetRange]) -> None:
    """Raise what a consumer error (`where`: its partition, None for a client-wide one from error_cb) means for
    the batch; return for the transient ones librdkafka retries itself (a broker down: the deadline decides)."""
    code = error.code()
    said = f"{error.name()}: {error.str()}"
    if where is not None and code in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET,
                                      KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                                      KafkaError._UNKNOWN_PARTITION):
        raise _data_loss(where, wanted, said)
    if code in (KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.COORDINATOR_NOT_AVAILABLE):
        return  # librdkafka looks for the group's coordinator; an assigned read never uses it (nor does Spark's)
    explained = explain_refusal(settings, said, topics=sorted({r.topic for r in ranges}),
                                topic_operations="READ and DESCRIBE")
    if explained is not None:  # a refused login or certificate, a missing READ grant
        raise explained
    if error.fatal() or code == KafkaError._AUTHENTICATION:
        raise ConfigurationError(f"the Kafka client of the write cannot read from {settings.bootstrap_servers} "
                                 f"({settings.origin}): {said}")
    if where is not None and not error.retriable():
        raise SourceUnavailableError(f"reading {where[0]}[{where[1]}] from Kafka failed: {said}")


def _data_loss(where: tuple[str, int], wanted: OffsetRange | None, said: str) -> DataLossError:
    start = f" from offset {wanted.start}" if wanted is not None else ""
    return DataLossError(f"the planned records of {where[0]}[{where[1]}]{start} are gone from Kafka (retention, or the "
                         f"topic was deleted or recreated since planning): {said}. Nothing was committed; the next run "
                         "re-plans and applies data_loss_policy")
