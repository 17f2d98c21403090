"""Kafka transactions that outlive the producer that opened them (two-phase commit).

Phase 1 (`open_transaction` + writes + `pre_commit`) runs in the task that
writes a micro-batch. It flushes the records into an open Kafka transaction and
closes its producer *without* ending the transaction, returning a small
`TransactionHandle` (transactional id, producer id, epoch) that can be stored as
JSON. Phase 2 (`commit_transaction` or `abort_transaction`) runs later, possibly
in another process on another machine: it builds a fresh producer with the same
transactional id, puts it into the stored transaction and sends EndTxn.

This is the idea of Flink's ``FlinkKafkaInternalProducer.resumeTransaction``.
The public kafka-python API cannot do it: a fresh producer must call
``init_transactions()``, which makes the coordinator bump the epoch and abort
exactly the transaction we want to commit. So this module reaches into
kafka-python internals, and is the only module of the project that does.

Internals used (read off kafka-python 3.0.12, ``kafka/producer/kafka.py`` and
``kafka/producer/transaction_manager.py``):

* ``KafkaProducer._transaction_manager`` (a ``TransactionManager``) and
  ``KafkaProducer._sender`` (its I/O thread, woken with ``wakeup()``).
* ``TransactionManager._transition_to(state)``, ``TransactionState``,
  ``set_producer_id_and_epoch(ProducerIdAndEpoch(...))``,
  ``begin_commit()`` / ``begin_abort()`` (return a result with
  ``wait(timeout_ms)``), ``has_error()``, ``last_error``, ``_lock``.
* ``TransactionManager._partitions_in_transaction`` (partitions the broker has
  acknowledged in AddPartitionsToTxn), ``_new_partitions_in_transaction`` /
  ``_pending_partitions_in_transaction`` (not yet acknowledged) and
  ``_transaction_started``. kafka-python skips the EndTxn request when
  ``_transaction_started`` is false ("no partitions or offsets were added"),
  and in a resumed producer nothing was added *by that producer*, so we set it.

Facts about kafka-python 3.0.12 this relies on (checked in its source):

* ``KafkaProducer.close()`` flushes and stops the sender thread; neither it nor
  the sender's shutdown path aborts an ongoing transaction (unlike the Java
  client, whose Sender aborts on close). The ``atexit``/``__del__`` cleanup
  also only calls ``close()``. So after ``pre_commit`` the transaction stays
  open on the broker until EndTxn or ``transaction_timeout_ms``.
* ``EndTxnHandler`` turns INVALID_PRODUCER_EPOCH and PRODUCER_FENCED into
  ``ProducerFencedError``, INVALID_TXN_STATE into ``InvalidTxnStateError``,
  and any other non-retriable code into a plain ``KafkaError`` whose message
  names the broker error (e.g. ``InvalidProducerIdMappingError``). Retriable
  codes (coordinator loading / moved, concurrent transactions) and lost
  connections are retried forever, so we bound the wait ourselves.

`check_kafka_python_internals()` verifies all of this is still there and is
called on every use; if kafka-python changed, you get `KafkaInternalsChanged`
naming what is missing instead of a silently wrong commit.

The protocol: resuming a transaction from a stored (producer id, epoch) holds
only under the classic transaction protocol, where the epoch of a transaction
is the epoch its producer got from InitProducerId. Transactions v2 (KIP-890,
on by default from Kafka 4.0) bump the epoch on every commit and are used only
by clients sending EndTxn version 5 or above; kafka-python 3.0.12 caps EndTxn at
version 3, so Kafka 4.x brokers keep the classic protocol for it.
`check_transaction_protocol()` checks, on every transactional producer this
module makes, the EndTxn version that producer will send to its broker, and
fails with `TransactionProtocolUnsupported` if it is 5 or above.

No Airflow or PySpark imports here on purpose: this module must be importable
in any worker (Spark executors, plain subprocesses) that has kafka-python.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import kafka
import kafka.errors as Errors
from kafka import KafkaProducer

from airflow_exactly_once.core.errors import SinkError

log = logging.getLogger(__name__)

KAFKA_PYTHON_VERSION_READ = "3.0.12"

__all__ = [
    "KafkaTransactionError",
    "TransactionLost",
    "TransactionCoordinatorUnavailable",
    "KafkaInternalsChanged",
    "TransactionProtocolUnsupported",
    "TransactionHandle",
    "open_transaction",
    "pre_commit",
    "commit_transaction",
    "abort_transaction",
    "check_kafka_python_internals",
    "check_transaction_protocol",
]

# EndTxn version 5 is transactions v2 (KIP-890 part 2): the epoch changes on every commit.
END_TXN_TRANSACTIONS_V2 = 5


# --------------------------------------------------------------------------- errors


class KafkaTransactionError(SinkError):
    """Base error of this module; a SinkError, so `retriable` tells whether trying again can help."""


class TransactionLost(KafkaTransactionError):
    """The broker will not commit this transaction (any more).

    Raised when the broker answers EndTxn with PRODUCER_FENCED /
    INVALID_PRODUCER_EPOCH (a newer producer with the same transactional id
    fenced it, or the coordinator aborted it on timeout), INVALID_TXN_STATE or
    INVALID_PRODUCER_ID_MAPPING (the transactional id's state is gone or belongs
    to another producer id). Its records are aborted, or - if an earlier
    commit of the same handle had already succeeded before the transactional id
    was reused - committed; the broker does not say which, so a caller that
    may have committed before must consult its own record of that. Never
    retriable: retrying cannot change the answer.
    """

    retriable = False

    def __init__(self, handle: "TransactionHandle", reason: str) -> None:
        self.handle = handle
        self.reason = reason
        super().__init__(
            f"Kafka transaction {handle.transactional_id!r} (producer_id={handle.producer_id}, "
            f"epoch={handle.epoch}) can no longer be committed: {reason}"
        )


class TransactionCoordinatorUnavailable(KafkaTransactionError):
    """Kafka could not be reached or did not answer in time; retrying later can succeed."""

    retriable = True


class KafkaInternalsChanged(KafkaTransactionError):
    """The installed kafka-python lacks the internals this module drives."""

    retriable = False


class TransactionProtocolUnsupported(KafkaTransactionError):
    """The producer would end transactions with transactions v2 (EndTxn v5+), which resuming cannot work with."""

    retriable = False


# --------------------------------------------------------------------------- internals check


def check_kafka_python_internals(producer: KafkaProducer | None = None) -> None:
    """Raise `KafkaInternalsChanged` unless the kafka-python internals we use exist.

    Without `producer` only the classes are checked; with one, also the
    instance attributes of its TransactionManager.
    """
    problems: list[str] = []
    try:
        from kafka.producer import transaction_manager as tm_module
    except ImportError as exc:  # pragma: no cover - depends on the installed version
        raise KafkaInternalsChanged(_internals_message([f"kafka.producer.transaction_manager: {exc}"])) from exc

    for name in ("TransactionManager", "TransactionState", "ProducerIdAndEpoch"):
        if not hasattr(tm_module, name):
            problems.append(f"kafka.producer.transaction_manager.{name}")
    state = getattr(tm_module, "TransactionState", None)
    for member in ("INITIALIZING", "READY", "IN_TRANSACTION"):
        if state is not None and not hasattr(state, member):
            problems.append(f"TransactionState.{member}")
    manager_cls = getattr(tm_module, "TransactionManager", None)
    for method in ("_transition_to", "set_producer_id_and_epoch", "begin_commit", "begin_abort",
                   "has_error", "is_transactional"):
        if manager_cls is not None and not callable(getattr(manager_cls, method, None)):
            problems.append(f"TransactionManager.{method}()")

    if producer is not None:
        manager = getattr(producer, "_transaction_manager", None)
        if manager is None:
            problems.append("KafkaProducer._transaction_manager (is transactional_id set?)")
        else:
            for attr in ("_lock", "_current_state", "_transaction_started", "_partitions_in_transaction",
                         "_new_partitions_in_transaction", "_pending_partitions_in_transaction",
                         "producer_id_and_epoch", "transactional_id"):
                if not hasattr(manager, attr):
                    problems.append(f"TransactionManager.{attr}")
        sender = getattr(producer, "_sender", None)
        if sender is None or not callable(getattr(sender, "wakeup", None)):
            problems.append("KafkaProducer._sender.wakeup()")
    if problems:
        raise KafkaInternalsChanged(_internals_message(problems))


def check_transaction_protocol(producer: KafkaProducer, bootstrap_servers: Any = "") -> int:
    """The EndTxn version `producer` will send to its broker; raise unless it is below 5.

    The version is what kafka-python negotiates: the lower of the cap its EndTxn handler puts
    on the request and the broker's highest EndTxn version (known once the producer has
    bootstrapped, which KafkaProducer does on construction). A kafka-python that raises the
    cap to 5 against a Kafka 4.x broker would make the broker bump the epoch at every commit,
    so a stored (producer id, epoch) could no longer be resumed: refused here, never silently.
    """
    try:
        from kafka.producer.transaction_manager import EndTxnHandler

        request = EndTxnHandler(producer._transaction_manager, True).request
        client = producer._sender._client
    except (ImportError, AttributeError, TypeError) as exc:
        raise KafkaInternalsChanged(_internals_message([f"EndTxnHandler(manager, committed).request ({exc})"])) from exc
    cap = request._max_version if request._max_version is not None else type(request).max_version
    try:
        version = client.api_version(request, max_version=cap)
    except Errors.IllegalStateError:  # not bootstrapped: the client's own cap is all we know
        version = cap
    except Errors.IncompatibleBrokerVersion as exc:
        raise TransactionProtocolUnsupported(
            f"the Kafka brokers at {bootstrap_servers} do not support EndTxn ({exc}); the Kafka sink's "
            "EXACTLY_ONCE needs brokers with transactions (Kafka 0.11 or later)") from exc
    if version >= END_TXN_TRANSACTIONS_V2:
        raise TransactionProtocolUnsupported(
            f"the installed kafka-python {getattr(kafka, '__version__', '?')} would end transactions with EndTxn "
            f"v{version} against the brokers at {bootstrap_servers}: transactions v2 (KIP-890) bump the producer "
            "epoch on every commit, so a pre-committed transaction could not be resumed and committed by "
            f"notify_complete. Install kafka-python=={KAFKA_PYTHON_VERSION_READ} (it ends transactions with "
            "EndTxn v3, which Kafka 4.x brokers serve with the classic protocol), or set the sink's guarantee to "
            "AT_LEAST_ONCE.")
    return version


def _internals_message(problems: list[str]) -> str:
    return (
        f"airflow_exactly_once.sinks.kafka_transactions drives kafka-python internals read off "
        f"kafka-python {KAFKA_PYTHON_VERSION_READ}, but the installed kafka-python "
        f"{getattr(kafka, '__version__', '?')} lacks: {', '.join(problems)}. "
        f"Install kafka-python=={KAFKA_PYTHON_VERSION_READ} or adapt this module to the new internals."
    )


# --------------------------------------------------------------------------- handle


@dataclass(frozen=True)
class TransactionHandle:
    """What phase 2 needs to finish a pre-committed transaction; JSON-serialisable.

    `partitions` are the (topic, partition) pairs the broker accepted into the
    transaction. `started` is False when nothing was written (no partitions or
    offsets added): the broker then has no transaction to end, and commit and
    abort are no-ops.
    """

    transactional_id: str
    producer_id: int
    epoch: int
    partitions: tuple[tuple[str, int], ...] = field(default=())
    started: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "epoch": self.epoch,
            "partitions": [[topic, partition] for topic, partition in self.partitions],
            "started": self.started,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TransactionHandle":
        try:
            return cls(
                transactional_id=str(data["transactional_id"]),
                producer_id=int(data["producer_id"]),
                epoch=int(data["epoch"]),
                partitions=tuple((str(t), int(p)) for t, p in data.get("partitions", ())),
                started=bool(data.get("started", True)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"Not a Kafka TransactionHandle dict: {data!r} ({exc})") from exc


# --------------------------------------------------------------------------- phase 1


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


# --------------------------------------------------------------------------- phase 2


def commit_transaction(bootstrap_servers: str | list[str], handle: TransactionHandle, **producer_config: Any) -> None:
    """Commit the pre-committed transaction `handle` from any process.

    Calling it again for a handle whose commit already succeeded is a no-op
    as long as nothing has reused the transactional id since (the broker
    answers EndTxn(commit) on a CompleteCommit transaction of the same epoch
    with success). Raises `TransactionLost` when the broker refuses (fenced by
    a newer producer, timed out and aborted, unknown id) and
    `TransactionCoordinatorUnavailable` when Kafka cannot be reached or does not
    answer within ``max_block_ms`` (default 60 s) - then retry with the same
    handle.
    """
    _end_transaction(bootstrap_servers, handle, commit=True, producer_config=producer_config)


def abort_transaction(bootstrap_servers: str | list[str], handle: TransactionHandle, **producer_config: Any) -> bool:
    """Abort the pre-committed transaction `handle`; idempotent.

    Resumes exactly this (producer id, epoch) and sends EndTxn(abort), so a
    newer attempt using the same transactional id is left alone (fencing with
    ``init_transactions`` would abort that one too). Returns True when the
    broker confirmed the abort (also if it had already been aborted at this
    epoch), False when there was nothing left to abort: the transaction was
    already ended - aborted on timeout, fenced, or committed - or was empty.
    Never raises because the transaction is gone; raises
    `TransactionCoordinatorUnavailable` (retriable) when Kafka cannot be
    reached, and a non-retriable `KafkaTransactionError` for anything else
    (e.g. not authorized for the transactional id, changed internals).
    """
    try:
        return _end_transaction(bootstrap_servers, handle, commit=False, producer_config=producer_config)
    except TransactionLost as lost:
        log.info("Nothing to abort for %s: %s", handle, lost.reason)
        return False


def _end_transaction(bootstrap_servers, handle: TransactionHandle, *, commit: bool, producer_config) -> bool:
    check_kafka_python_internals()
    verb = "commit" if commit else "abort"
    if not handle.started:
        log.info("Transaction %s is empty; nothing to %s.", handle, verb)
        return False
    producer = _new_producer(bootstrap_servers, handle.transactional_id, None, producer_config)
    try:
        _resume(producer, handle)
        manager = producer._transaction_manager
        result = manager.begin_commit() if commit else manager.begin_abort()
        producer._sender.wakeup()
        wait_ms = producer.config["max_block_ms"]
        try:
            finished = result.wait(timeout_ms=wait_ms)
        except Errors.KafkaError as exc:
            lost_reason = _lost_reason(exc)
            if lost_reason is not None:
                raise TransactionLost(handle, lost_reason) from exc
            raise KafkaTransactionError(
                f"Kafka refused to {verb} transaction {handle.transactional_id!r} (producer_id="
                f"{handle.producer_id}, epoch={handle.epoch}): {exc}. If this is an authorization error, "
                f"grant WRITE on the transactional id and retry before the transaction times out."
            ) from exc
        if not finished:
            raise TransactionCoordinatorUnavailable(
                f"No answer from the Kafka transaction coordinator at {bootstrap_servers} within "
                f"max_block_ms={wait_ms} ms to {verb} transaction {handle.transactional_id!r} "
                f"(producer_id={handle.producer_id}, epoch={handle.epoch}). Check that the brokers are up "
                f"and reachable (and the __transaction_state topic is online), then call {verb}_transaction "
                f"again with the same handle before transaction_timeout_ms expires."
            )
        return True
    finally:
        # Nothing is buffered; don't wait on a sender still retrying an unanswered EndTxn.
        producer.close(timeout=1)


def _lost_reason(exc: BaseException) -> str | None:
    """Why the broker will not end this transaction, or None if `exc` is something else."""
    if isinstance(exc, (Errors.ProducerFencedError, Errors.InvalidProducerEpochError)):
        return (f"{type(exc).__name__}: a newer producer epoch exists for this transactional id (another "
                f"attempt called init_transactions, or the coordinator aborted the transaction on timeout)")
    if isinstance(exc, Errors.InvalidTxnStateError):
        return (f"{type(exc).__name__}: the coordinator's transaction for this producer epoch is not "
                f"open any more (it was ended the other way, or never had records)")
    if isinstance(exc, Errors.InvalidProducerIdMappingError):
        return f"{type(exc).__name__}: the coordinator no longer maps this transactional id to this producer id"
    if type(exc) is Errors.KafkaError:
        # EndTxnHandler wraps unhandled broker codes: KafkaError("Unhandled error in EndTxnResponse: [Error 49] ...")
        text = str(exc)
        for cls in (Errors.InvalidProducerIdMappingError, Errors.UnknownProducerIdError,
                    Errors.TransactionalIdNotFoundError, Errors.InvalidProducerEpochError):
            if cls.__name__ in text:
                return f"{text}: the coordinator has no transaction for this producer id and epoch"
    return None


def _new_producer(bootstrap_servers, transactional_id, transaction_timeout_ms, producer_config) -> KafkaProducer:
    config = dict(producer_config)
    config["bootstrap_servers"] = bootstrap_servers
    config["transactional_id"] = transactional_id
    if transaction_timeout_ms is not None:
        config["transaction_timeout_ms"] = transaction_timeout_ms
    try:
        producer = KafkaProducer(**config)
    except (Errors.KafkaTimeoutError, Errors.KafkaConnectionError) as exc:
        raise TransactionCoordinatorUnavailable(
            f"Cannot connect to Kafka at {bootstrap_servers} ({type(exc).__name__}: {exc}). Check that the "
            f"brokers are running and bootstrap_servers is right, then retry with the same transactional id/handle."
        ) from exc
    try:
        check_transaction_protocol(producer, bootstrap_servers)
    except KafkaTransactionError:
        producer.close(timeout=0)
        raise
    return producer


def _resume(producer: KafkaProducer, handle: TransactionHandle) -> None:
    """Put `producer`'s TransactionManager into the transaction of `handle` without InitProducerId."""
    check_kafka_python_internals(producer)
    from kafka.producer.transaction_manager import ProducerIdAndEpoch, TransactionState
    from kafka.structs import TopicPartition

    manager = producer._transaction_manager
    with manager._lock:
        if manager._current_state != TransactionState.UNINITIALIZED:
            raise KafkaInternalsChanged(
                f"A fresh transactional KafkaProducer is in state {manager._current_state.name}, expected "
                f"UNINITIALIZED; kafka-python's producer start-up changed (read off {KAFKA_PYTHON_VERSION_READ})."
            )
        # Same path init_transactions() takes locally, minus the InitProducerId request.
        manager._transition_to(TransactionState.INITIALIZING)
        manager.set_producer_id_and_epoch(ProducerIdAndEpoch(handle.producer_id, handle.epoch))
        manager._transition_to(TransactionState.READY)
        manager._transition_to(TransactionState.IN_TRANSACTION)
        # The broker already holds these partitions in the transaction; marking
        # them (and the transaction as started) makes kafka-python send EndTxn
        # instead of completing an "empty" transaction locally.
        manager._partitions_in_transaction.update(TopicPartition(t, p) for t, p in handle.partitions)
        manager._transaction_started = True
