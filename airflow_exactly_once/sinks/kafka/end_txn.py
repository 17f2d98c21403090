"""Phase 2 of the Kafka two-phase commit: ending pre-committed transactions with EndTxn, from any process.

`end_transactions` (and `commit_transaction` / `abort_transaction` for one handle) sends the
transaction coordinator EndTxn(transactional id, producer id, epoch, commit or abort) for each
stored `TransactionHandle`, possibly in another process on another machine than the one that
opened the transaction. That is the request a producer resumed into the stored transaction
would send (Flink's ``FlinkKafkaInternalProducer.resumeTransaction`` and then commit). The
public kafka-python API cannot send it: a fresh producer must call ``init_transactions()``,
which makes the coordinator bump the epoch and abort exactly the transaction we want to commit.
Resuming a kafka-python producer (setting its TransactionManager's producer id and epoch)
worked, but cost a whole producer per transaction (bootstrap, ApiVersions, FindCoordinator, its
sender loop), one after the other (docs/benchmarks.md). So this module speaks the protocol
itself, over one kafka-python admin client: one FindCoordinator for every transactional id of
the batch, then every EndTxn pipelined on its coordinator's connection, then all the answers.
The admin client's internals it drives are listed and checked in kafka_python_internals.py; its
EndTxn stays below version 5, so the brokers keep the classic transaction protocol for it
(transaction_protocol.py).

The coordinator answers EndTxn (classic protocol) with NONE also when the transaction has
already ended the same way at this epoch (so a repeated commit or abort is a no-op),
CONCURRENT_TRANSACTIONS while it is still writing the markers of PrepareCommit/PrepareAbort,
PRODUCER_FENCED or INVALID_PRODUCER_EPOCH when a newer epoch exists (fenced, or aborted on
timeout), INVALID_TXN_STATE when the transaction of this epoch ended the other way, and
INVALID_PRODUCER_ID_MAPPING when the id is unknown or belongs to another producer id. Retriable
codes (coordinator loading or moved, concurrent transactions) and lost connections are retried,
within the caller's bound, with a fresh FindCoordinator each round.

No Airflow or PySpark imports here on purpose: this module must be importable
in any worker (Spark executors, plain subprocesses) that has kafka-python.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from typing import Any, Iterable, Iterator

import kafka.errors as Errors
from kafka import KafkaAdminClient
from kafka.future import Future

from airflow_exactly_once.core.errors import SinkError, TransactionLostError
from airflow_exactly_once.sinks.kafka.kafka_python_internals import check_kafka_python_internals
from airflow_exactly_once.sinks.kafka.transaction_errors import (
    KafkaTransactionError,
    TransactionCoordinatorUnavailable,
    transaction_lost,
    unreachable,
)
from airflow_exactly_once.sinks.kafka.transaction_handle import TransactionHandle
from airflow_exactly_once.sinks.kafka.transaction_protocol import END_TXN_VERSION_CAP, end_txn_version

log = logging.getLogger(__name__)

__all__ = ["coordinator_client", "end_transactions", "commit_transaction", "abort_transaction"]

# How long phase 2 keeps trying when Kafka does not answer: KafkaProducer's max_block_ms default.
END_TIMEOUT_MS = 60_000


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
        raise unreachable(bootstrap_servers, exc) from exc
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
