"""The errors of the Kafka sink's transactions, shared by both phases of its two-phase commit.

They are SinkErrors, so `retriable` tells whether trying again can help. The writers (librdkafka.py,
writer.py, kafka_python_producer.py) raise them in phase 1, the EndTxn pipeline (end_txn.py) in phase 2,
and the checks of kafka-python (kafka_python_internals.py, transaction_protocol.py) when the installed
release cannot do what the sink relies on. A transaction the broker will not commit any more is the core's
TransactionLostError (`transaction_lost`), not an error of the sink's own. One module for all of them, so
that every module of the adapter can raise them without importing another phase.

No Airflow or PySpark imports: the writers on the Spark executors raise them.
"""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.core.errors import SinkError, TransactionLostError
from airflow_exactly_once.sinks.kafka.transaction_handle import TransactionHandle

__all__ = [
    "KafkaTransactionError",
    "TransactionCoordinatorUnavailable",
    "KafkaInternalsChanged",
    "TransactionProtocolUnsupported",
]


class KafkaTransactionError(SinkError):
    """Base error of this module; a SinkError, so `retriable` tells whether trying again can help."""


def transaction_lost(handle: TransactionHandle, reason: str) -> TransactionLostError:
    """The broker will not commit this transaction (any more): the core's TransactionLostError, not retriable.

    The broker answered EndTxn with PRODUCER_FENCED / INVALID_PRODUCER_EPOCH (a
    newer producer with the same transactional id fenced it, or the coordinator
    aborted it on timeout), INVALID_TXN_STATE or INVALID_PRODUCER_ID_MAPPING (the
    transactional id's state is gone or belongs to another producer id). Its
    records are aborted, or - if an earlier commit of the same handle had already
    succeeded before the transactional id was reused - committed; the broker does
    not say which, so a caller that may have committed before must consult its
    own record of that (the sink reads the output). `lost` is the transactional
    id; the batch is the caller's to add.
    """
    return TransactionLostError(
        f"Kafka transaction {handle.transactional_id!r} (producer_id={handle.producer_id}, "
        f"epoch={handle.epoch}) can no longer be committed: {reason}",
        sink="kafka", lost=[handle.transactional_id], reason=reason, retriable=False)


class TransactionCoordinatorUnavailable(KafkaTransactionError):
    """Kafka could not be reached or did not answer in time; retrying later can succeed."""

    retriable = True


class KafkaInternalsChanged(KafkaTransactionError):
    """The installed kafka-python lacks the internals the Kafka sink's transaction adapter drives."""

    retriable = False


class TransactionProtocolUnsupported(KafkaTransactionError):
    """The producer would end transactions with transactions v2 (EndTxn v5+), which resuming cannot work with."""

    retriable = False


def unreachable(bootstrap_servers: Any, exc: BaseException) -> TransactionCoordinatorUnavailable:
    """No broker answered a client's bootstrap: retriable, with what to check."""
    return TransactionCoordinatorUnavailable(
        f"Cannot connect to Kafka at {bootstrap_servers} ({type(exc).__name__}: {exc}). Check that the "
        f"brokers are running and bootstrap_servers is right, then retry with the same transactional id/handle.")
