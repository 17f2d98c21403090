"""Kafka transactions that outlive the producer that opened them (two-phase commit).

Phase 1 (`open_transaction` + writes + `pre_commit`) runs in the task that
writes a micro-batch. It flushes the records into an open Kafka transaction and
closes its producer *without* ending the transaction, returning a small
`TransactionHandle` (transactional id, producer id, epoch) that can be stored as
JSON. (The Kafka sink's writers do phase 1 with librdkafka instead, librdkafka.py;
their handles are the same.) Phase 2 (`end_transactions`, and `commit_transaction` /
`abort_transaction` for one handle) runs later, possibly in another process on
another machine: it sends the transaction coordinator EndTxn(transactional id,
producer id, epoch, commit or abort) for the stored handle.

That is the request a producer resumed into the stored transaction would send
(Flink's ``FlinkKafkaInternalProducer.resumeTransaction`` and then commit). The
public kafka-python API cannot send it: a fresh producer must call
``init_transactions()``, which makes the coordinator bump the epoch and abort
exactly the transaction we want to commit. Resuming a kafka-python producer
(setting its TransactionManager's producer id and epoch) worked, but cost a
whole producer per transaction (bootstrap, ApiVersions, FindCoordinator, its
sender loop), one after the other (docs/benchmarks.md). So phase 2 speaks the
protocol itself, over one kafka-python admin client: one FindCoordinator for
every transactional id of the batch, then every EndTxn pipelined on its
coordinator's connection, then all the answers. This module reaches into
kafka-python internals, and is the only module of the project that does.

Internals used (read off kafka-python 3.0.12):

* Phase 1, ``kafka/producer/kafka.py`` and ``kafka/producer/transaction_manager.py``:
  ``KafkaProducer._transaction_manager`` (a ``TransactionManager``) with
  ``_lock``, ``_current_state`` (a ``TransactionState``), ``has_error()``,
  ``last_error``, ``producer_id_and_epoch``, ``transactional_id``,
  ``_partitions_in_transaction`` (partitions the broker has acknowledged in
  AddPartitionsToTxn), ``_new_partitions_in_transaction`` /
  ``_pending_partitions_in_transaction`` (not yet acknowledged) and
  ``_transaction_started`` (false when no partitions or offsets were added).
* Phase 2, ``kafka/admin/client.py``, ``kafka/net/manager.py`` and ``kafka/protocol``:
  ``KafkaAdminClient._manager`` (its ``KafkaConnectionManager``): ``run(coroutine, *args)``
  runs a coroutine on the admin client's I/O thread and returns its result,
  ``send(request, node_id=, request_timeout_ms=)`` returns an awaitable
  ``kafka.future.Future`` of the response (a failed one when the node cannot be
  reached), ``cluster.add_coordinator(row, key_type, key, synthesize_node_id=False)``
  makes a FindCoordinator answer's node addressable, and ``broker_version_data.api_version(request)``
  negotiates a request's version. The protocol classes ``EndTxnRequest`` /
  ``EndTxnResponse`` (``kafka.protocol.producer.transaction``) and
  ``FindCoordinatorRequest`` / ``FindCoordinatorResponse`` / ``CoordinatorType``
  (``kafka.protocol.metadata``), built from Kafka's JSON schemas (their ``fields``).
  A connection carries at most ``max_in_flight_requests_per_connection`` requests
  at once (it refuses more with NodeNotReadyError "paused"), so at most that many
  EndTxn are in flight per coordinator.

Facts this relies on:

* ``KafkaProducer.close()`` flushes and stops the sender thread; neither it nor
  the sender's shutdown path aborts an ongoing transaction (unlike the Java
  client, whose Sender aborts on close). The ``atexit``/``__del__`` cleanup
  also only calls ``close()``. So after ``pre_commit`` the transaction stays
  open on the broker until EndTxn or ``transaction_timeout_ms``.
* The coordinator answers EndTxn (classic protocol) with NONE also when the
  transaction has already ended the same way at this epoch (so a repeated
  commit or abort is a no-op), CONCURRENT_TRANSACTIONS while it is still
  writing the markers of PrepareCommit/PrepareAbort, PRODUCER_FENCED or
  INVALID_PRODUCER_EPOCH when a newer epoch exists (fenced, or aborted on
  timeout), INVALID_TXN_STATE when the transaction of this epoch ended the
  other way, and INVALID_PRODUCER_ID_MAPPING when the id is unknown or belongs
  to another producer id. Retriable codes (coordinator loading or moved,
  concurrent transactions) and lost connections are retried, within the
  caller's bound, with a fresh FindCoordinator each round.

`check_kafka_python_internals()` verifies all of this is still there and is
called on every use; if kafka-python changed, you get `KafkaInternalsChanged`
naming what is missing instead of a silently wrong commit.

The protocol: ending a transaction from a stored (producer id, epoch) holds
only under the classic transaction protocol, where the epoch of a transaction
is the epoch its producer got from InitProducerId. Transactions v2 (KIP-890,
on by default from Kafka 4.0) bump the epoch on every commit and are used only
by clients sending EndTxn version 5 or above. Phase 2 caps its EndTxn at
version 3 (`END_TXN_VERSION_CAP`, kafka-python 3.0.12's own cap), so Kafka 4.x
brokers keep the classic protocol for it; it checks the version it negotiates,
and `check_transaction_protocol()` checks the EndTxn version of every
transactional producer this module makes: either fails with
`TransactionProtocolUnsupported` at 5 or above.

No Airflow or PySpark imports here on purpose: this module must be importable
in any worker (Spark executors, plain subprocesses) that has kafka-python.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import kafka
import kafka.errors as Errors
from kafka import KafkaAdminClient, KafkaProducer
from kafka.future import Future

from airflow_exactly_once.core.errors import SinkError, TransactionLostError

log = logging.getLogger(__name__)

KAFKA_PYTHON_VERSION_READ = "3.0.12"

__all__ = [
    "KafkaTransactionError",
    "TransactionCoordinatorUnavailable",
    "KafkaInternalsChanged",
    "TransactionProtocolUnsupported",
    "TransactionHandle",
    "open_transaction",
    "pre_commit",
    "coordinator_client",
    "end_transactions",
    "commit_transaction",
    "abort_transaction",
    "check_kafka_python_internals",
    "check_transaction_protocol",
    "end_txn_version",
]

# EndTxn version 5 is transactions v2 (KIP-890 part 2): the epoch changes on every commit.
END_TXN_TRANSACTIONS_V2 = 5
# The highest EndTxn version phase 2 sends: kafka-python 3.0.12's own cap (v4 only adds an error code).
END_TXN_VERSION_CAP = 3
# How long phase 2 keeps trying when Kafka does not answer: KafkaProducer's max_block_ms default.
END_TIMEOUT_MS = 60_000


# --------------------------------------------------------------------------- errors


class KafkaTransactionError(SinkError):
    """Base error of this module; a SinkError, so `retriable` tells whether trying again can help."""


def transaction_lost(handle: "TransactionHandle", reason: str) -> TransactionLostError:
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
    """The installed kafka-python lacks the internals this module drives."""

    retriable = False


class TransactionProtocolUnsupported(KafkaTransactionError):
    """The producer would end transactions with transactions v2 (EndTxn v5+), which resuming cannot work with."""

    retriable = False


# --------------------------------------------------------------------------- internals check

# Fields of the protocol messages phase 2 builds and reads (kafka-python builds the classes from Kafka's schemas).
_PROTOCOL_FIELDS = {
    ("kafka.protocol.producer.transaction", "EndTxnRequest"): ("transactional_id", "producer_id", "producer_epoch",
                                                              "committed"),
    ("kafka.protocol.producer.transaction", "EndTxnResponse"): ("error_code",),
    ("kafka.protocol.metadata", "FindCoordinatorRequest"): ("key", "key_type", "coordinator_keys"),
    ("kafka.protocol.metadata", "FindCoordinatorResponse"): ("error_code", "node_id", "host", "port", "coordinators"),
}


def check_kafka_python_internals(producer: KafkaProducer | None = None, admin: KafkaAdminClient | None = None) -> None:
    """Raise `KafkaInternalsChanged` unless the kafka-python internals we use exist.

    Without arguments only the classes are checked; with `producer`, also the
    instance attributes of its TransactionManager (phase 1); with `admin`, the
    connection manager phase 2 sends its requests through.
    """
    problems: list[str] = []
    try:
        from kafka.producer import transaction_manager as tm_module
    except ImportError as exc:  # pragma: no cover - depends on the installed version
        raise KafkaInternalsChanged(_internals_message([f"kafka.producer.transaction_manager: {exc}"])) from exc

    for name in ("TransactionManager", "TransactionState"):
        if not hasattr(tm_module, name):
            problems.append(f"kafka.producer.transaction_manager.{name}")
    state = getattr(tm_module, "TransactionState", None)
    if state is not None and not hasattr(state, "IN_TRANSACTION"):
        problems.append("TransactionState.IN_TRANSACTION")
    manager_cls = getattr(tm_module, "TransactionManager", None)
    if manager_cls is not None and not callable(getattr(manager_cls, "has_error", None)):
        problems.append("TransactionManager.has_error()")
    problems += _protocol_problems()

    if producer is not None:
        manager = getattr(producer, "_transaction_manager", None)
        if manager is None:
            problems.append("KafkaProducer._transaction_manager (is transactional_id set?)")
        else:
            for attr in ("_lock", "_current_state", "_transaction_started", "_partitions_in_transaction",
                         "_new_partitions_in_transaction", "_pending_partitions_in_transaction",
                         "producer_id_and_epoch", "transactional_id", "last_error"):
                if not hasattr(manager, attr):
                    problems.append(f"TransactionManager.{attr}")
    if admin is not None:
        manager = getattr(admin, "_manager", None)
        for method in ("run", "send"):
            if not callable(getattr(manager, method, None)):
                problems.append(f"KafkaAdminClient._manager.{method}()")
        if not callable(getattr(getattr(manager, "cluster", None), "add_coordinator", None)):
            problems.append("KafkaAdminClient._manager.cluster.add_coordinator()")
        if not callable(getattr(getattr(manager, "broker_version_data", None), "api_version", None)):
            problems.append("KafkaAdminClient._manager.broker_version_data.api_version()")
        for key in ("bootstrap_servers", "max_in_flight_requests_per_connection", "retry_backoff_ms",
                    "request_timeout_ms"):
            if key not in getattr(admin, "config", {}):
                problems.append(f"KafkaAdminClient.config[{key!r}]")
    if problems:
        raise KafkaInternalsChanged(_internals_message(problems))


def _protocol_problems() -> list[str]:
    import importlib

    problems = []
    for (module_name, name), fields in _PROTOCOL_FIELDS.items():
        try:
            cls = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):
            problems.append(f"{module_name}.{name}")
            continue
        known = getattr(cls, "fields", None) or {}
        problems += [f"{name}.{f}" for f in fields if f not in known]
    try:
        from kafka.protocol.metadata import CoordinatorType

        CoordinatorType.TRANSACTION  # noqa: B018 - the attribute must exist
    except (ImportError, AttributeError):
        problems.append("kafka.protocol.metadata.CoordinatorType.TRANSACTION")
    return problems


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
        raise _no_end_txn(bootstrap_servers, exc) from exc
    return _classic_end_txn(version, bootstrap_servers)


def _classic_end_txn(version: int, bootstrap_servers: Any) -> int:
    """`version` if EndTxn at that version keeps the classic protocol, else TransactionProtocolUnsupported."""
    if version >= END_TXN_TRANSACTIONS_V2:
        raise TransactionProtocolUnsupported(
            f"the installed kafka-python {getattr(kafka, '__version__', '?')} would end transactions with EndTxn "
            f"v{version} against the brokers at {bootstrap_servers}: transactions v2 (KIP-890) bump the producer "
            "epoch on every commit, so a pre-committed transaction could not be resumed and committed by "
            f"notify_complete. Install kafka-python=={KAFKA_PYTHON_VERSION_READ} (it ends transactions with "
            "EndTxn v3, which Kafka 4.x brokers serve with the classic protocol), or set the sink's guarantee to "
            "AT_LEAST_ONCE.")
    return version


def _no_end_txn(bootstrap_servers: Any, exc: BaseException) -> TransactionProtocolUnsupported:
    return TransactionProtocolUnsupported(
        f"the Kafka brokers at {bootstrap_servers} do not support EndTxn ({exc}); the Kafka sink's "
        "EXACTLY_ONCE needs brokers with transactions (Kafka 0.11 or later)")


def end_txn_version(broker_version_data: Any, bootstrap_servers: Any = "") -> int:
    """The EndTxn version phase 2 sends to brokers described by `broker_version_data` (kafka-python's
    BrokerVersionData); raise unless it keeps the classic protocol (below 5).

    Phase 2 caps its requests at END_TXN_VERSION_CAP; this checks that kafka-python honours the cap.
    """
    from kafka.protocol.producer.transaction import EndTxnRequest

    request = EndTxnRequest(transactional_id="", producer_id=-1, producer_epoch=-1, committed=True,
                            max_version=END_TXN_VERSION_CAP)
    if broker_version_data is None:  # not bootstrapped: the cap is all we know
        return _classic_end_txn(END_TXN_VERSION_CAP, bootstrap_servers)
    try:
        version = broker_version_data.api_version(request)
    except Errors.IncompatibleBrokerVersion as exc:
        raise _no_end_txn(bootstrap_servers, exc) from exc
    return _classic_end_txn(version, bootstrap_servers)


def _internals_message(problems: list[str]) -> str:
    return (
        f"{__name__} drives kafka-python internals read off "
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


@contextlib.contextmanager
def coordinator_client(bootstrap_servers: str | list[str], **client_config: Any) -> Iterator[KafkaAdminClient]:
    """A kafka-python admin client for `end_transactions`, closed on exit.

    `client_config` takes KafkaProducer or KafkaAdminClient keywords (security, timeouts); those the
    admin client does not know (max_block_ms, acks, ...) are left out. Raises
    `TransactionCoordinatorUnavailable` when no broker answers within bootstrap_timeout_ms.
    """
    config = {k: v for k, v in client_config.items() if k in KafkaAdminClient.DEFAULT_CONFIG}
    config["bootstrap_servers"] = bootstrap_servers
    try:
        admin = KafkaAdminClient(**config)
    except (Errors.KafkaTimeoutError, Errors.KafkaConnectionError) as exc:
        raise _unreachable(bootstrap_servers, exc) from exc
    try:
        yield admin
    finally:
        admin.close()


def end_transactions(admin: KafkaAdminClient, handles: Iterable[TransactionHandle], *, commit: bool,
                     timeout_ms: int = END_TIMEOUT_MS) -> dict[TransactionHandle, SinkError | None]:
    """Commit (or abort) every pre-committed transaction of `handles` through `admin`'s connections.

    One FindCoordinator asks for the coordinators of all their transactional ids, then every
    EndTxn goes out pipelined on its coordinator's connection; the answers are awaited together.
    Retriable answers (coordinator loading or moved, concurrent transactions, lost connections)
    are retried, with a fresh FindCoordinator, until `timeout_ms` has passed. Returns, per handle:

    * None: the broker ended it as asked, also if it already had at this epoch (so calling again
      after a success is a no-op), or there was nothing to end (an empty transaction);
    * `TransactionLostError` (`transaction_lost`): the broker will not end it so (fenced by a newer epoch, aborted on
      timeout, ended the other way, unknown id);
    * `TransactionCoordinatorUnavailable` (retriable): no answer within `timeout_ms`;
    * another `KafkaTransactionError` (not retriable): refused, e.g. not authorized for the id.

    Every handle gets its own answer: one lost transaction does not keep the others from ending.
    """
    check_kafka_python_internals(admin=admin)
    handles = list(dict.fromkeys(handles))
    verb = "commit" if commit else "abort"
    servers = admin.config["bootstrap_servers"]
    results: dict[TransactionHandle, SinkError | None] = {}
    for handle in handles:
        if not handle.started:
            log.info("Transaction %s is empty; nothing to %s.", handle, verb)
            results[handle] = None
    pending = [h for h in handles if h.started]
    if not pending:
        return results
    manager = admin._manager
    end_txn_version(manager.broker_version_data, servers)
    window = max(1, int(admin.config["max_in_flight_requests_per_connection"]))
    backoff_s = admin.config["retry_backoff_ms"] / 1000
    deadline = time.monotonic() + timeout_ms / 1000
    while pending:
        # Bounded by what is left (at least a second: a request that times out closes its connection).
        request_timeout_ms = min(admin.config["request_timeout_ms"],
                                 max(1000, int((deadline - time.monotonic()) * 1000)))
        answers = manager.run(_end_round, manager, pending, commit, window, request_timeout_ms)
        retry: dict[TransactionHandle, BaseException] = {}
        for handle in pending:
            answer = answers[handle]
            if answer is None:
                results[handle] = None
            elif (reason := _lost_reason(answer)) is not None:
                results[handle] = transaction_lost(handle, reason)
            elif getattr(answer, "retriable", False):
                retry[handle] = answer
            else:
                results[handle] = KafkaTransactionError(
                    f"Kafka refused to {verb} transaction {handle.transactional_id!r} (producer_id="
                    f"{handle.producer_id}, epoch={handle.epoch}): {answer}. If this is an authorization error, "
                    f"grant WRITE on the transactional id and retry before the transaction times out.")
        pending = list(retry)
        if pending and time.monotonic() + backoff_s >= deadline:
            for handle, last in retry.items():
                results[handle] = TransactionCoordinatorUnavailable(
                    f"No answer from the Kafka transaction coordinator at {servers} within {timeout_ms} ms to "
                    f"{verb} transaction {handle.transactional_id!r} (producer_id={handle.producer_id}, epoch="
                    f"{handle.epoch}); the last attempt got {last}. Check that the brokers "
                    f"are up and reachable (and the __transaction_state topic is online), then call "
                    f"{verb}_transaction again with the same handle before transaction_timeout_ms expires.")
            break
        if pending:
            log.info("Retrying to %s %d transaction(s) in %.0f ms: %s", verb, len(pending), backoff_s * 1000,
                     "; ".join(f"{h.transactional_id}: {type(e).__name__}" for h, e in retry.items()))
            time.sleep(backoff_s)
    return {handle: results[handle] for handle in handles}


async def _end_round(manager: Any, handles: list[TransactionHandle], commit: bool, window: int,
                     request_timeout_ms: int) -> dict[TransactionHandle, BaseException | None]:
    """One try at every handle, on the admin client's I/O thread: the broker's error (None for
    success) or the client's exception, per handle."""
    from kafka.protocol.producer.transaction import EndTxnRequest

    answers: dict[TransactionHandle, BaseException | None] = {}
    try:
        nodes = await _find_coordinators(manager, sorted({h.transactional_id for h in handles}), request_timeout_ms)
    except Errors.KafkaError as exc:  # no broker answered: every handle waits for the next round
        return {handle: exc for handle in handles}
    queues: dict[Any, deque[TransactionHandle]] = {}
    for handle in handles:
        node = nodes[handle.transactional_id]
        if isinstance(node, BaseException):
            answers[handle] = node
        else:
            queues.setdefault(node, deque()).append(handle)
    # Up to `window` requests in flight per connection; a connection answers in the order it was asked.
    flying: deque[tuple[Any, TransactionHandle, Future]] = deque()
    in_flight: Counter = Counter()
    while True:
        for node, queue in queues.items():
            while queue and in_flight[node] < window:
                handle = queue.popleft()
                request = EndTxnRequest(transactional_id=handle.transactional_id, producer_id=handle.producer_id,
                                        producer_epoch=handle.epoch, committed=commit,
                                        max_version=END_TXN_VERSION_CAP)
                flying.append((node, handle, _send(manager, request, node, request_timeout_ms)))
                in_flight[node] += 1
        if not flying:
            return answers
        node, handle, future = flying.popleft()
        try:
            response = await future
        except Errors.KafkaError as exc:
            answers[handle] = exc
        else:
            error = Errors.for_code(response.error_code)
            answers[handle] = None if error is Errors.NoError else error()
        in_flight[node] -= 1


async def _find_coordinators(manager: Any, transactional_ids: list[str],
                             request_timeout_ms: int) -> dict[str, Any]:
    """The coordinator node of each transactional id, or the error FindCoordinator gave for it."""
    from kafka.protocol.metadata import CoordinatorType, FindCoordinatorRequest

    key_type = CoordinatorType.TRANSACTION
    if manager.broker_version_data.api_version(FindCoordinatorRequest) >= 4:  # KIP-699: all keys at once
        request = FindCoordinatorRequest(key_type=key_type.value, coordinator_keys=transactional_ids, min_version=4)
        response = await _send(manager, request, None, request_timeout_ms)
        rows = [(row.key, row) for row in response.coordinators]
    else:
        rows = []
        for tid in transactional_ids:
            request = FindCoordinatorRequest(key=tid, key_type=key_type.value, max_version=3)
            rows.append((tid, await _send(manager, request, None, request_timeout_ms)))
    nodes: dict[str, Any] = {tid: Errors.CoordinatorNotAvailableError("no answer for this id")
                             for tid in transactional_ids}
    for tid, row in rows:
        error = Errors.for_code(row.error_code)
        if error is Errors.NoError:
            nodes[tid] = manager.cluster.add_coordinator(row, key_type, tid, synthesize_node_id=False)
        else:
            nodes[tid] = error(getattr(row, "error_message", None) or "FindCoordinator")
    return nodes


def _send(manager: Any, request: Any, node_id: Any, request_timeout_ms: int) -> Future:
    """The response's future; a failed one when the request cannot even be queued."""
    try:
        return manager.send(request, node_id=node_id, request_timeout_ms=request_timeout_ms)
    except Errors.KafkaError as exc:  # e.g. a node that failed authentication, an unknown node id
        return Future().failure(exc)


def commit_transaction(bootstrap_servers: str | list[str], handle: TransactionHandle, **client_config: Any) -> None:
    """Commit the pre-committed transaction `handle` from any process: `end_transactions` for one handle.

    Calling it again for a handle whose commit already succeeded is a no-op
    as long as nothing has reused the transactional id since (the broker
    answers EndTxn(commit) on a CompleteCommit transaction of the same epoch
    with success). Raises `TransactionLostError` when the broker refuses (fenced by
    a newer producer, timed out and aborted, unknown id) and
    `TransactionCoordinatorUnavailable` when Kafka cannot be reached or does not
    answer within ``max_block_ms`` (default 60 s) - then retry with the same
    handle. `client_config`: KafkaProducer or KafkaAdminClient keywords (see `coordinator_client`).
    """
    error = _end_one(bootstrap_servers, handle, commit=True, client_config=client_config)
    if error is not None:
        raise error


def abort_transaction(bootstrap_servers: str | list[str], handle: TransactionHandle, **client_config: Any) -> bool:
    """Abort the pre-committed transaction `handle`; idempotent.

    Sends EndTxn(abort) for exactly this (producer id, epoch), so a newer
    attempt using the same transactional id is left alone (fencing with
    ``init_transactions`` would abort that one too). Returns True when the
    broker confirmed the abort (also if it had already been aborted at this
    epoch), False when there was nothing left to abort: the transaction was
    already ended - aborted on timeout, fenced, or committed - or was empty.
    Never raises because the transaction is gone; raises
    `TransactionCoordinatorUnavailable` (retriable) when Kafka cannot be
    reached, and a non-retriable `KafkaTransactionError` for anything else
    (e.g. not authorized for the transactional id, changed internals).
    """
    error = _end_one(bootstrap_servers, handle, commit=False, client_config=client_config)
    if isinstance(error, TransactionLostError):
        log.info("Nothing to abort for %s: %s", handle, error.reason)
        return False
    if error is not None:
        raise error
    return handle.started


def _end_one(bootstrap_servers, handle: TransactionHandle, *, commit: bool,
             client_config: dict[str, Any]) -> SinkError | None:
    check_kafka_python_internals()
    if not handle.started:  # nothing on the broker: no need to connect
        log.info("Transaction %s is empty; nothing to %s.", handle, "commit" if commit else "abort")
        return None
    timeout_ms = int(client_config.get("max_block_ms", END_TIMEOUT_MS))
    with coordinator_client(bootstrap_servers, **client_config) as admin:
        return end_transactions(admin, [handle], commit=commit, timeout_ms=timeout_ms)[handle]


def _lost_reason(exc: BaseException) -> str | None:
    """Why the broker will not end this transaction, or None if `exc` is something else."""
    if isinstance(exc, (Errors.ProducerFencedError, Errors.InvalidProducerEpochError)):
        # Named as kafka-python's and Java's producers report both codes (KIP-360).
        said = "" if isinstance(exc, Errors.ProducerFencedError) else f" (the broker said {type(exc).__name__})"
        return (f"ProducerFencedError{said}: a newer producer epoch exists for this transactional id (another "
                f"attempt called init_transactions, or the coordinator aborted the transaction on timeout)")
    if isinstance(exc, Errors.InvalidTxnStateError):
        return (f"{type(exc).__name__}: the coordinator's transaction for this producer epoch is not "
                f"open any more (it was ended the other way, or never had records)")
    if isinstance(exc, (Errors.InvalidProducerIdMappingError, Errors.UnknownProducerIdError,
                        Errors.TransactionalIdNotFoundError)):
        return (f"{type(exc).__name__}: the coordinator no longer maps this transactional id to this producer id "
                f"and epoch")
    return None


def _unreachable(bootstrap_servers: Any, exc: BaseException) -> TransactionCoordinatorUnavailable:
    """No broker answered a client's bootstrap: retriable, with what to check."""
    return TransactionCoordinatorUnavailable(
        f"Cannot connect to Kafka at {bootstrap_servers} ({type(exc).__name__}: {exc}). Check that the "
        f"brokers are running and bootstrap_servers is right, then retry with the same transactional id/handle.")


def _new_producer(bootstrap_servers, transactional_id, transaction_timeout_ms, producer_config) -> KafkaProducer:
    config = dict(producer_config)
    config["bootstrap_servers"] = bootstrap_servers
    config["transactional_id"] = transactional_id
    if transaction_timeout_ms is not None:
        config["transaction_timeout_ms"] = transaction_timeout_ms
    try:
        producer = KafkaProducer(**config)
    except (Errors.KafkaTimeoutError, Errors.KafkaConnectionError) as exc:
        raise _unreachable(bootstrap_servers, exc) from exc
    try:
        check_transaction_protocol(producer, bootstrap_servers)
    except KafkaTransactionError:
        producer.close(timeout=0)
        raise
    return producer
