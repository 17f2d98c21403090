"""The Kafka sink's data path: confluent-kafka (librdkafka) producers, and their open transactions.

kafka-python's send path is pure Python; librdkafka sends an order of magnitude more records a
second per process (docs/benchmarks.md). So the writers produce with confluent-kafka, and the
transaction they leave open is committed later, from another process, by the kafka-python
adapter (end_txn.py), which ends it with EndTxn from its producer id and epoch.

librdkafka does not hand out its producer id and epoch, and confluent-kafka's `close()`
aborts an open transaction. So after flushing, the writer asks the coordinator for the
transaction (DescribeTransactions: state, producer id, epoch, partitions), then releases
the producer without `close()` (confluent-kafka 2.16 destroys it without ending the
transaction) and asks again: if the transaction was ended on release, a newer
confluent-kafka behaves differently, and `ReleaseEndedTransaction` says so instead of
letting every batch time out. Read off confluent-kafka 2.16.1 / librdkafka 2.16.0.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import confluent_kafka
from kafka import KafkaAdminClient

from airflow_exactly_once.sinks.kafka.transaction_errors import KafkaTransactionError, TransactionCoordinatorUnavailable
from airflow_exactly_once.sinks.kafka.transaction_handle import TransactionHandle

CONFLUENT_KAFKA_VERSION_READ = "2.16.1"
# Java's partitioner for keyed records (murmur2): the same key lands where Java producers put it.
PARTITIONER = "murmur2_random"
# Settings the sink sets itself: a user value would break the protocol.
RESERVED = ("bootstrap.servers", "transactional.id", "transaction.timeout.ms", "enable.idempotence", "acks")


class ReleaseEndedTransaction(KafkaTransactionError):
    """The installed confluent-kafka ended the open transaction when its producer was released."""

    retriable = False


def check_producer_config(config: dict[str, Any]) -> None:
    """Raise ValueError naming the properties librdkafka does not know (no connection is made)."""
    unknown = []
    for key, value in config.items():
        try:
            confluent_kafka.Producer({key: value, "bootstrap.servers": "127.0.0.1:9"}).flush(0)
        except confluent_kafka.KafkaException as exc:
            if "No such configuration property" in str(exc) or "Invalid value" in str(exc):
                unknown.append(f"{key} ({exc.args[0].str()})")
            else:
                raise
    if unknown:
        raise ValueError("; ".join(unknown))


def producer_properties(settings: dict[str, Any], guarantee: str, transactional_id: str | None = None,
                    transaction_timeout_ms: int | None = None) -> dict[str, Any]:
    """librdkafka properties of a producer for `guarantee`; `settings` (servers, security, tuning) win over
    the defaults, never over what the guarantee needs (RESERVED).

    A transactional producer connects to every broker at once (enable.sparse.connections=false): with
    sparse connections, librdkafka drops its bootstrap connection once it learns the brokers, finds no
    broker up to ask for the transaction coordinator, and asks again only at its 500 ms timer, which
    made most init_transactions() calls wait for that timer (docs/benchmarks.md): a Spark partition's largest
    fixed cost. A cluster of very many
    brokers can set it back to true in the sink's producer_config.
    """
    config = {"partitioner": PARTITIONER, "linger.ms": 20,
              **({"enable.sparse.connections": False} if guarantee == "EXACTLY_ONCE" else {}), **settings}
    if guarantee == "EXACTLY_ONCE":
        config.update({"transactional.id": transactional_id, "transaction.timeout.ms": transaction_timeout_ms,
                       "enable.idempotence": True})
    elif guarantee == "AT_LEAST_ONCE":
        config.update({"acks": "all", "enable.idempotence": True})
    else:
        config.update({"acks": 0, "enable.idempotence": False})
    return config


def new_producer(settings: dict[str, Any], guarantee: str, transactional_id: str | None = None,
                 transaction_timeout_ms: int | None = None, on_delivery: Callable[[Any, Any], None] | None = None,
                 report_successes: bool = True) -> confluent_kafka.Producer:
    """A producer for `guarantee` (see producer_properties).

    `on_delivery` is called for every record, or with `report_successes=False` only for the records that
    failed: a delivery report costs a Python call and a message object per record, a large share of the
    writer's CPU (docs/benchmarks.md).
    """
    config = producer_properties(settings, guarantee, transactional_id, transaction_timeout_ms)
    if on_delivery is not None:
        config["on_delivery"] = on_delivery
        config["delivery.report.only.error"] = not report_successes
    return confluent_kafka.Producer(config)


def fence(settings: dict[str, Any], transactional_id: str, transaction_timeout_ms: int,
          timeout_s: float = 30.0) -> None:
    """Initialise `transactional_id` anew: the coordinator aborts its open transaction and bumps its epoch, so
    a producer still holding the old epoch (a zombie writer) can neither commit nor write into it again."""
    producer = new_producer(settings, "EXACTLY_ONCE", transactional_id, transaction_timeout_ms)
    try:
        producer.init_transactions(timeout_s)
    except confluent_kafka.KafkaException as exc:
        raise transaction_error(exc, f"fencing transactional id {transactional_id!r}") from None
    finally:
        producer.flush(0)
        del producer  # nothing was begun: destroying it ends nothing


def transaction_error(exc: BaseException, what: str) -> KafkaTransactionError:
    """A librdkafka error as the adapter's error, keeping whether a retry can help."""
    error = exc.args[0] if exc.args and isinstance(exc.args[0], confluent_kafka.KafkaError) else None
    if error is None:
        return KafkaTransactionError(f"{what} failed: {exc}", retriable=True)
    if error.code() in (confluent_kafka.KafkaError._TIMED_OUT, confluent_kafka.KafkaError._TRANSPORT,
                        confluent_kafka.KafkaError._ALL_BROKERS_DOWN):
        return TransactionCoordinatorUnavailable(f"{what} failed: {error.str()} ({error.name()})")
    return KafkaTransactionError(f"{what} failed: {error.str()} ({error.name()})",
                                 retriable=bool(error.retriable()) and not error.fatal())


def transaction_failure(producer: confluent_kafka.Producer) -> Any:
    """Why librdkafka failed the producer's open transaction, or None.

    When the broker refuses a step of the transaction (a topic the user may not write), librdkafka
    purges the queued records and reports each only as _PURGE_QUEUE. A transactional call that the
    failed state does not allow returns the transaction's own error; begin_transaction() is such a
    call that can never commit anything.
    """
    try:
        producer.begin_transaction()
    except confluent_kafka.KafkaException as exc:
        error = exc.args[0] if exc.args and isinstance(exc.args[0], confluent_kafka.KafkaError) else None
        if error is not None and (error.txn_requires_abort() or error.fatal()):
            return error
    return None


def describe_open(admin: KafkaAdminClient, transactional_id: str, timeout_s: float = 30.0) -> TransactionHandle:
    """The coordinator's view of an open transaction, as the handle that commits it later."""
    deadline = time.monotonic() + timeout_s
    described = admin.describe_transactions([transactional_id])[transactional_id]
    while described.state.value == "Empty" and time.monotonic() < deadline:
        time.sleep(0.1)  # the coordinator has not seen the first AddPartitionsToTxn yet
        described = admin.describe_transactions([transactional_id])[transactional_id]
    if described.state.value != "Ongoing":
        raise KafkaTransactionError(f"transaction {transactional_id!r} is {described.state.value} after its records "
                                    "were flushed, not Ongoing", retriable=True)
    partitions = tuple(sorted((tp.topic, tp.partition) for tp in described.topic_partitions))
    return TransactionHandle(transactional_id, described.producer_id, described.producer_epoch, partitions)


def release_keeping_transaction(holder: list[confluent_kafka.Producer], admin: KafkaAdminClient,
                                transactional_id: str) -> TransactionHandle:
    """Release the producer in `holder` (its only reference) leaving its flushed transaction open.

    Returns the transaction's handle. Raises ReleaseEndedTransaction if releasing ended it.
    """
    handle = describe_open(admin, transactional_id)
    holder.clear()  # the last reference: the producer is destroyed now, without close() (which aborts)
    after = admin.describe_transactions([transactional_id])[transactional_id]
    if (after.state.value, after.producer_id, after.producer_epoch) != ("Ongoing", handle.producer_id, handle.epoch):
        raise ReleaseEndedTransaction(
            f"confluent-kafka {confluent_kafka.version()[0]} ended transaction {transactional_id!r} when its producer "
            f"was released (now {after.state.value}, producer {after.producer_id}, epoch {after.producer_epoch}); the "
            "Kafka sink relies on a pre-committed transaction staying open (read off confluent-kafka "
            f"{CONFLUENT_KAFKA_VERSION_READ}). Install confluent-kafka=={CONFLUENT_KAFKA_VERSION_READ}.")
    return handle
