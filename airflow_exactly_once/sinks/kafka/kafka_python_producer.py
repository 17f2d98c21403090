"""Phase 1 of the Kafka two-phase commit with a kafka-python producer: a transaction that outlives its producer.

`open_transaction` + writes + `pre_commit` run in the task that writes a micro-batch. They flush the
records into an open Kafka transaction and close the producer *without* ending the transaction,
returning a small `TransactionHandle` (transactional id, producer id, epoch) that can be stored as
JSON; phase 2 (end_txn.py) ends it later, possibly in another process on another machine. The Kafka
sink's writers do phase 1 with librdkafka instead (librdkafka.py); their handles are the same.

This relies on kafka-python 3.0.12 (its internals used here are listed and checked in
kafka_python_internals.py): ``KafkaProducer.close()`` flushes and stops the sender thread; neither
it nor the sender's shutdown path aborts an ongoing transaction (unlike the Java client, whose
Sender aborts on close). The ``atexit``/``__del__`` cleanup also only calls ``close()``. So after
``pre_commit`` the transaction stays open on the broker until EndTxn or ``transaction_timeout_ms``.
Every producer made here is checked to end transactions with the classic protocol
(transaction_protocol.py).

No Airflow or PySpark imports here on purpose: this module must be importable
in any worker (Spark executors, plain subprocesses) that has kafka-python.
"""

from __future__ import annotations

from typing import Any

import kafka.errors as Errors
from kafka import KafkaProducer

from airflow_exactly_once.sinks.kafka.kafka_python_internals import check_kafka_python_internals
from airflow_exactly_once.sinks.kafka.transaction_errors import (
    KafkaTransactionError,
    TransactionCoordinatorUnavailable,
    unreachable,
)
from airflow_exactly_once.sinks.kafka.transaction_handle import TransactionHandle
from airflow_exactly_once.sinks.kafka.transaction_protocol import check_transaction_protocol

__all__ = ["open_transaction", "pre_commit"]


def open_transaction(
    bootstrap_servers: str | list[str],
    transactional_id: str,
    transaction_timeout_ms: int,
    **producer_config: Any,
) -> KafkaProducer:
    """A transactional producer inside a freshly begun transaction.

    `init_transactions()` fences every earlier producer with this
    transactional id and aborts its open transaction, so a retried attempt
    never lets a previous attempt's records through.
    """
    check_kafka_python_internals()
    producer = _new_producer(bootstrap_servers, transactional_id, transaction_timeout_ms, producer_config)
    try:
        producer.init_transactions()
        producer.begin_transaction()
    except BaseException as exc:
        producer.close(timeout=0)
        if isinstance(exc, Errors.AuthorizationError):  # e.g. no WRITE on the transactional id: a retry cannot help
            raise KafkaTransactionError(
                f"Kafka at {bootstrap_servers} refused transactional id {transactional_id!r}: "
                f"{type(exc).__name__}: {exc}", retriable=False) from exc
        if isinstance(exc, Errors.KafkaTimeoutError):
            raise TransactionCoordinatorUnavailable(
                f"Kafka at {bootstrap_servers} did not initialise transactional id {transactional_id!r} "
                f"within max_block_ms={producer.config['max_block_ms']} ms ({exc}). Check that the brokers "
                f"and the __transaction_state topic are available, then retry."
            ) from exc
        raise
    return producer


def pre_commit(producer: KafkaProducer, timeout_s: float | None = None) -> TransactionHandle:
    """Flush the records, then close `producer` leaving its transaction open on the broker.

    Raises `KafkaTransactionError` (retriable when the cause is) if any record
    failed; the transaction is then left to be aborted by the next
    `open_transaction` with the same id or by the broker's timeout.
    """
    check_kafka_python_internals(producer)
    manager = producer._transaction_manager
    if timeout_s is None:
        timeout_s = producer.config["max_block_ms"] / 1000
    try:
        producer.flush(timeout=timeout_s)
    except Errors.KafkaError as exc:
        producer.close(timeout=0)
        raise KafkaTransactionError(
            f"Flushing transaction {manager.transactional_id!r} failed: {exc}", retriable=exc.retriable
        ) from exc

    from kafka.producer.transaction_manager import TransactionState

    with manager._lock:
        error = manager.last_error if manager.has_error() else None
        state = manager._current_state
        unconfirmed = set(manager._new_partitions_in_transaction) | set(manager._pending_partitions_in_transaction)
        handle = TransactionHandle(
            transactional_id=manager.transactional_id,
            producer_id=manager.producer_id_and_epoch.producer_id,
            epoch=manager.producer_id_and_epoch.epoch,
            partitions=tuple(sorted((tp.topic, tp.partition) for tp in manager._partitions_in_transaction)),
            started=bool(manager._transaction_started),
        )
    if error is not None or state != TransactionState.IN_TRANSACTION or unconfirmed:
        producer.close(timeout=0)
        problem = (f"the producer failed: {error}" if error is not None
                   else f"partitions {sorted(map(tuple, unconfirmed))} were never added to it" if unconfirmed
                   else f"the producer is in state {state.name}, not IN_TRANSACTION")
        raise KafkaTransactionError(
            f"Cannot pre-commit transaction {manager.transactional_id!r}: {problem}",
            retriable=bool(getattr(error, "retriable", False)),
        )
    # close() flushes (nothing left) and stops the sender; it does not abort.
    producer.close(timeout=timeout_s)
    return handle


def _new_producer(bootstrap_servers, transactional_id, transaction_timeout_ms, producer_config) -> KafkaProducer:
    config = dict(producer_config)
    config["bootstrap_servers"] = bootstrap_servers
    config["transactional_id"] = transactional_id
    if transaction_timeout_ms is not None:
        config["transaction_timeout_ms"] = transaction_timeout_ms
    try:
        producer = KafkaProducer(**config)
    except (Errors.KafkaTimeoutError, Errors.KafkaConnectionError) as exc:
        raise unreachable(bootstrap_servers, exc) from exc
    try:
        check_transaction_protocol(producer, bootstrap_servers)
    except KafkaTransactionError:
        producer.close(timeout=0)
        raise
    return producer
