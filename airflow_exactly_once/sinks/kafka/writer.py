"""The Kafka sink's partition writer: one Spark partition's records into one producer, on an executor.

Under EXACTLY_ONCE the producer uses the partition's transactional id of the batch (pooled:
(prefix, slot, partition), see sinks.kafka.transactional_ids): `init_transactions()` fences and
aborts whatever an earlier attempt of the same partition left open (the batch's claim is
checked first, so a zombie of an aborted batch does not touch a slot a later batch took over),
then the records go into a new transaction that is flushed and left open
(pre-commit, see librdkafka.py). The partition's `PartitionReport` is its commit message:
the transaction's handle and the first offset written to each output partition (which
decides "committed or aborted" if the broker later forgets the transaction).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import confluent_kafka
from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from airflow_exactly_once.core.claim import ClaimCheck
from airflow_exactly_once.core.sink import PartitionWriter
from airflow_exactly_once.kafka.liveness import reachable
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks.kafka import librdkafka, probe, producer_pool
from airflow_exactly_once.sinks.kafka.committable import PartitionReport
from airflow_exactly_once.sinks.kafka.transactional_ids import IdNaming, per_batch_id
from airflow_exactly_once.sinks.kafka.transaction_errors import KafkaTransactionError
from airflow_exactly_once.sinks.kafka.transaction_handle import TransactionHandle

Columns = tuple[list[Any], list[Any], list[Any] | None]  # keys (or Nones), values, headers (or None) of some records


def transactional_id(prefix: str, batch_seq: int, partition: int) -> str:
    """The per-batch naming (`transactional_ids="per_batch"`, and every batch of the first releases)."""
    return per_batch_id(prefix, batch_seq, partition)


def arrow_columns(batches: Iterable[Any]) -> Iterator[Columns]:
    """(keys, values, headers) of Arrow batches with a `value` and optional `key` and `headers` columns."""
    for batch in batches:
        values = batch.column("value").to_pylist()
        keys = batch.column("key").to_pylist() if "key" in batch.schema.names else [None] * len(values)
        headers = None
        if "headers" in batch.schema.names:
            headers = [None if h is None else [(item["key"], item["value"]) for item in h]
                       for h in batch.column("headers").to_pylist()]
        yield keys, values, headers


class _Deliveries:
    """Delivery errors, and with `firsts` the first acknowledged offset per output partition (librdkafka's
    callback: for every record with `firsts`, else for failed records only)."""

    def __init__(self, firsts: bool) -> None:
        self.firsts = firsts
        self.first: dict[tuple[str, int], int] = {}
        self.errors: list[Any] = []

    def __call__(self, error: Any, message: Any) -> None:
        if error is not None:
            self.errors.append(error)
            return
        key, offset = (message.topic(), message.partition()), message.offset()
        if 0 <= offset < self.first.get(key, offset + 1):
            self.first[key] = offset


@dataclass(frozen=True)
class KafkaPartitionWriter(PartitionWriter):
    """Everything an executor needs, pickled into the Spark task: plain settings, no clients."""

    topic: str
    guarantee: str
    transactional_id_prefix: str
    batch_seq: int
    transaction_timeout_ms: int
    settings: KafkaSettings
    producer_config: dict[str, Any] = field(default_factory=dict)  # librdkafka tuning (linger.ms, ...)
    flush_timeout_s: float = 120.0
    naming: IdNaming | None = None  # None: per-batch ids under the prefix (callers from before pooling)

    def write(self, partition: int, batches: Iterator[Any], claim: ClaimCheck | None = None) -> PartitionReport:
        return self.write_columns(partition, arrow_columns(batches), claim)

    def write_records(self, partition: int, records: Iterable[tuple[Any, Any]]) -> PartitionReport:
        """The same for (key, value) pairs (tests, and callers without Arrow)."""
        pairs = list(records)
        return self.write_columns(partition, [([k for k, _ in pairs], [v for _, v in pairs], None)])

    def write_columns(self, partition: int, columns: Iterable[Columns],
                      claim: ClaimCheck | None = None) -> PartitionReport:
        """Send the records under the sink's guarantee; the partition's report."""
        if self.guarantee != "EXACTLY_ONCE":
            deliveries = _Deliveries(firsts=False)  # nothing is committed later: only errors matter
            with producer_pool.borrowed({**self.settings.librdkafka(), **self.producer_config}, self.guarantee,
                                        deliveries if self.guarantee != "NONE" else None) as producer:
                count = self._deliver(producer, partition, columns, deliveries, exactly_once=False)
            return PartitionReport(partition, count, ())
        with contextlib.closing(KafkaAdminClient(**reachable(self.settings).kafka_python(KafkaAdminClient))) as admin:
            return self._write_transaction(partition, columns, claim, admin)

    def _write_transaction(self, partition: int, columns: Iterable[Columns], claim: ClaimCheck | None,
                           admin: KafkaAdminClient) -> PartitionReport:
        """EXACTLY_ONCE: the records in a transaction left open (pre-commit) and its handle.

        The claim is checked after `init_transactions` (which fences earlier holders of the id) and before
        the transaction begins: either the batch is still this attempt's, or an abort that came before
        the check fences this producer when it releases the batch (KafkaSinkCommitter.abort). Where the transaction
        begins in each output partition is asked of the brokers afterwards (DescribeProducers) when they
        let this client, else collected from a delivery report per record.
        """
        tid = self.transactional_id(partition)
        if claim is not None:  # before InitProducerId, which aborts what the id holds (pooled: maybe a later batch's)
            claim.ensure(f"initialising Kafka transactional id {tid!r}")
        ask_brokers = probe.may_describe_producers(admin, self.topic)
        deliveries = _Deliveries(firsts=not ask_brokers)
        holder = [self._producer(tid, deliveries)]
        try:
            self._call(lambda: holder[0].init_transactions(60), f"initialising transactional id {tid!r}")
            if claim is not None:
                claim.ensure(f"beginning Kafka transaction {tid!r}")
            holder[0].begin_transaction()
            count = self._deliver(holder[0], partition, columns, deliveries, exactly_once=True)
            if not count:  # nothing to keep open: an empty transaction is just ended
                _give_up(holder.pop())
                return PartitionReport(partition, 0, ())
            handle = librdkafka.release_keeping_transaction(holder, admin, tid)  # pre-commit: it stays open
        except BaseException:
            if holder:  # end what this attempt opened (a retry of the partition or the driver's cleanup would)
                _give_up(holder.pop())
            raise
        first = deliveries.first if deliveries.firsts else self._transaction_starts(admin, handle)
        return PartitionReport(partition, count, tuple((t, p, o) for (t, p), o in sorted(first.items())), handle)

    def transactional_id(self, partition: int) -> str:
        if self.naming is None:
            return transactional_id(self.transactional_id_prefix, self.batch_seq, partition)
        return self.naming.transactional_id(self.batch_seq, partition)

    def _producer(self, tid: str, deliveries: _Deliveries) -> confluent_kafka.Producer:
        return librdkafka.new_producer({**self.settings.librdkafka(), **self.producer_config}, self.guarantee, tid,
                                       self.transaction_timeout_ms, deliveries,
                                       report_successes=deliveries.firsts)

    def _deliver(self, producer: confluent_kafka.Producer, partition: int, columns: Iterable[Columns],
                 deliveries: _Deliveries, exactly_once: bool) -> int:
        """Send and flush the records; how many. Raises when any was not delivered."""
        count = self._send(producer, columns)
        left = producer.flush(self.flush_timeout_s)
        if left:
            raise KafkaTransactionError(f"{left} of {count} records of partition {partition} were not delivered "
                                        f"to {self.topic!r} within {self.flush_timeout_s:g} s", retriable=True)
        if deliveries.errors:
            error = deliveries.errors[0]
            if exactly_once and error.code() == confluent_kafka.KafkaError._PURGE_QUEUE:
                error = librdkafka.transaction_failure(producer) or error  # the cause, not its symptom
            raise KafkaTransactionError(
                f"{len(deliveries.errors)} of {count} records of partition {partition} could not be written to "
                f"{self.topic!r}: {error.str()} ({error.name()})",
                retriable=bool(error.retriable()) and not error.fatal())
        return count

    def _transaction_starts(self, admin: KafkaAdminClient, handle: TransactionHandle) -> dict[tuple[str, int], int]:
        """The first offset of the open transaction in each partition it wrote, from the partitions' leaders."""
        try:
            return probe.transaction_start_offsets(admin, handle.producer_id, handle.partitions)
        except (KafkaError, LookupError) as exc:  # the transaction stays open: the driver's abort or a retry ends it
            raise KafkaTransactionError(f"cannot learn where transaction {handle.transactional_id!r} begins in "
                                        f"{self.topic!r}: {exc}", retriable=True) from exc

    def _send(self, producer: confluent_kafka.Producer, columns: Iterable[Columns]) -> int:
        """Hand every record to librdkafka (one `produce` call each: the loop is the writer's hot path)."""
        produce, topic, count = producer.produce, self.topic, 0
        try:
            for keys, values, headers in columns:
                if headers is None:
                    for key, value in zip(keys, values):
                        try:
                            produce(topic, value, key)
                        except BufferError:
                            _when_queued(producer, lambda: produce(topic, value, key))
                else:
                    for key, value, header in zip(keys, values, headers):
                        try:
                            produce(topic, value, key, headers=header)
                        except BufferError:
                            _when_queued(producer, lambda: produce(topic, value, key, headers=header))
                count += len(values)
                producer.poll(0)  # serve delivery reports as they come, not all at flush
        except confluent_kafka.KafkaException as exc:
            raise librdkafka.transaction_error(exc, f"writing to {topic!r}") from None
        return count

    @staticmethod
    def _call(action, what: str) -> None:
        try:
            action()
        except confluent_kafka.KafkaException as exc:
            raise librdkafka.transaction_error(exc, what) from None


def _when_queued(producer: confluent_kafka.Producer, produce: Callable[[], None]) -> None:
    """Produce once librdkafka's local queue has room again (it sends while we wait)."""
    while True:
        producer.poll(0.05)
        try:
            produce()
            return
        except BufferError:
            continue


def _give_up(producer: confluent_kafka.Producer) -> None:
    """Best effort: abort the attempt's transaction (the next attempt of this partition would fence it).

    Never raises: after a refused operation the producer is in a fatal state, its abort and close fail
    with INVALID_TXN_STATE, and that must not hide the error that made the writer give up.
    """
    try:
        producer.abort_transaction(10)
    except confluent_kafka.KafkaException:
        pass
    try:
        producer.close()
    except confluent_kafka.KafkaException:
        pass
