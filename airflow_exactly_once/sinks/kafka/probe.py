"""Questions the Kafka sink asks the output cluster, with kafka-python's public API only.

- the brokers' transaction.max.timeout.ms (plan-time guardrail),
- whether the client may write the output topic (plan time, so a missing ACL fails the plan),
- the state of a batch's transactions (before committing any of them),
- transactions a dead attempt left open (to abort them instead of waiting for the timeout),
- where a writer's open transaction begins in each partition (DescribeProducers, instead of a
  delivery report per record),
- whether a record is visible under read_committed: the arbiter when the broker no longer
  knows a transaction, because only the output itself says "committed" or "aborted".
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import kafka.errors as Errors
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from airflow_exactly_once.kafka.access import PROBE_BOOTSTRAP_TIMEOUT_MS
from airflow_exactly_once.kafka.liveness import reachable, silent
from airflow_exactly_once.kafka.settings import KafkaSettings

TRANSACTION_LOG = "__transaction_state"  # Kafka's internal topic of the transaction coordinators' state

def new_admin_client(settings: KafkaSettings) -> KafkaAdminClient:
    """An admin client of the output cluster, bootstrapped from a server that answers (kafka.liveness): raises when
    none answers in time."""
    return KafkaAdminClient(**{"bootstrap_timeout_ms": PROBE_BOOTSTRAP_TIMEOUT_MS,
                               **reachable(settings).kafka_python(KafkaAdminClient)})


@contextlib.contextmanager
def admin_client(settings: KafkaSettings) -> Iterator[KafkaAdminClient]:
    admin = new_admin_client(settings)
    try:
        yield admin
    finally:
        admin.close()


@dataclass(frozen=True)
class Brokers:
    """The cluster's brokers as a question that goes to every broker sees them: the ones that serve, and the ones
    left out, each with why (fenced by the controller: down or cut off; or did not answer within a short bound)."""

    serving: tuple[int, ...]
    away: tuple[tuple[int, str], ...] = ()

    def note(self) -> str:
        """What being left out means, for a log line or a message ("" when every broker serves)."""
        if not self.away:
            return ""
        nodes = "; ".join(f"node {node} {why}" for node, why in self.away)
        return (f"not asked: {nodes}. A node that is away coordinates no transactions and leads no partitions once "
                "the controller fenced it; restart it to have the whole cluster again")


def serving_brokers(admin: KafkaAdminClient, settings: KafkaSettings) -> Brokers:
    """The brokers DescribeCluster lists now (a request, not the client's cache, which keeps a dead node until
    metadata.max.age.ms), less the ones the controller fenced (Kafka 4 lists them, marked) and the ones that do not
    answer within kafka.liveness's bound (paused, or killed a moment ago and not yet fenced)."""
    listed = admin.describe_cluster()["brokers"]
    away = {int(b["broker_id"]): "is fenced by the controller (down or cut off)" for b in listed if b.get("is_fenced")}
    unfenced = {int(b["broker_id"]): f"{b['host']}:{b['port']}" for b in listed if not b.get("is_fenced")}
    away.update({node: f"at {unfenced[node]} {why}" for node, why in silent(settings, unfenced).items()})
    return Brokers(tuple(sorted(set(unfenced) - set(away))), tuple(sorted(away.items())))


@dataclass(frozen=True)
class BrokerMaximum:
    """The smallest transaction.max.timeout.ms of the brokers that were asked, and which were not."""

    ms: int
    brokers: Brokers


def broker_max_transaction_timeout_ms(admin: KafkaAdminClient, settings: KafkaSettings) -> BrokerMaximum:
    """The smallest transaction.max.timeout.ms of the serving brokers (any of them may coordinate a transaction; a
    node that is away coordinates none until it returns, and is named in the answer)."""
    brokers = serving_brokers(admin, settings)
    ids = [str(b) for b in brokers.serving]
    key = "transaction.max.timeout.ms"
    answer = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, b, {key: None}) for b in ids],
                                    config_filter="all")
    return BrokerMaximum(min(int(answer["broker"][b][key]["value"]) for b in ids), brokers)


def topic_partitions(admin: KafkaAdminClient, topic: str, timeout_s: float = 15.0,
                     operation: str | None = None, settle_s: float = 0.0) -> int:
    """Number of partitions of `topic`; 0 when it does not exist.

    A topic created a moment ago may still answer LEADER_NOT_AVAILABLE: wait for it. A broker
    of a cluster that has not yet heard of a topic created on another answers
    UNKNOWN_TOPIC_OR_PARTITION: with `settle_s`, that answer is believed only once it held
    that long (a check that refuses a missing topic uses it; a sweep of a deleted topic does not).
    With `operation` (e.g. "WRITE"), raises TopicAuthorizationFailedError unless the brokers
    allow this client that operation on the topic (the topic's authorized operations).
    """
    start = time.monotonic()
    deadline = start + timeout_s
    while True:
        try:
            [described] = admin.describe_topics([topic])
            error = Errors.for_code(described.get("error_code", 0))
        except Errors.UnknownTopicOrPartitionError:
            error = Errors.UnknownTopicOrPartitionError
        if error is Errors.UnknownTopicOrPartitionError:
            if time.monotonic() - start >= settle_s:
                return 0
        elif error is Errors.NoError and described.get("partitions"):
            allowed = described.get("authorized_operations")
            if operation and allowed is not None and operation not in allowed and "ALL" not in allowed:
                raise Errors.TopicAuthorizationFailedError(f"{operation} on topic {topic!r} (allowed: "
                                                           f"{', '.join(allowed) or 'nothing'})")
            return len(described["partitions"])
        elif time.monotonic() > deadline:
            raise error(f"describing topic {topic!r} failed")
        time.sleep(0.5)


@dataclass(frozen=True)
class TransactionState:
    """What the coordinator says about a transactional id now."""

    state: str  # Ongoing, PrepareCommit, CompleteCommit, PrepareAbort, CompleteAbort, Empty, Dead, ...
    producer_id: int
    epoch: int


def describe_transactions(admin: KafkaAdminClient, transactional_ids: list[str]) -> dict[str, Any]:
    """kafka-python's TransactionDescription of every id its coordinator still knows (the others are left out).

    All ids in one request per coordinator; kafka-python fails the whole answer when one id is
    unknown, and then each id is asked alone.
    """
    if not transactional_ids:
        return {}
    try:
        return admin.describe_transactions(transactional_ids)
    except Errors.TransactionalIdNotFoundError:
        described = {}
        for tid in transactional_ids:
            try:
                described.update(admin.describe_transactions([tid]))
            except Errors.TransactionalIdNotFoundError:
                pass
        return described


def transaction_states(admin: KafkaAdminClient, transactional_ids: list[str]) -> dict[str, TransactionState | None]:
    """The coordinator's view of each id; None when it no longer knows the id."""
    described = describe_transactions(admin, transactional_ids)
    return {tid: (TransactionState(described[tid].state.value, described[tid].producer_id,
                                   described[tid].producer_epoch) if tid in described else None)
            for tid in transactional_ids}


def may_describe_producers(admin: KafkaAdminClient, topic: str) -> bool:
    """Do the brokers answer DescribeProducers on `topic` for this client? It needs READ on the topic
    (an output-only principal has WRITE and DESCRIBE) and Kafka 2.8 or later."""
    try:
        admin.describe_producers([TopicPartition(topic, 0)])
    except Errors.KafkaError:
        return False
    return True


def transaction_start_offsets(admin: KafkaAdminClient, producer_id: int,
                              partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The first offset of producer `producer_id`'s open transaction in each partition (the leaders' view).

    Raises KafkaError when a leader refuses, or LookupError when one no longer shows the transaction open.
    """
    wanted = [TopicPartition(t, p) for t, p in partitions]
    described = admin.describe_producers(wanted)
    starts = {}
    for tp in wanted:
        found = [s.current_transaction_start_offset for s in described[tp].active_producers
                 if s.producer_id == producer_id and s.current_transaction_start_offset >= 0]
        if not found:
            raise LookupError(f"{tp.topic}[{tp.partition}] shows no open transaction of producer {producer_id}")
        starts[(tp.topic, tp.partition)] = found[0]
    return starts


def list_transactions(admin: KafkaAdminClient, settings: KafkaSettings, **filters: Any) -> list[Any]:
    """ListTransactions on every serving broker (kafka-python's keyword `filters`), the rows of all of them.

    Each coordinator lists the transactions of the partitions of Kafka's transaction log it leads. Raises
    CoordinatorNotAvailableError (retriable, naming the node) while a partition of the log is led by a node that is
    away or has no leader: a node died a moment ago and the controller has not moved its partitions yet, and a list
    without them would read as "nothing open" to the abort that fences what it finds, to the hanging sweep and to
    `transactions list`.
    """
    brokers = serving_brokers(admin, settings)
    listed = admin.list_transactions(broker_ids=list(brokers.serving), **filters)
    unled = transaction_log_unled(admin, brokers.serving)
    if unled:
        away, by_leader = dict(brokers.away), defaultdict(list)
        for partition, leader in unled:
            by_leader[leader].append(str(partition))
        leaders = "; ".join(f"partition(s) {', '.join(parts)} " + (
            f"led by node {leader}, which {away.get(leader, 'is not listed')}" if leader >= 0 else "without a leader")
            for leader, parts in sorted(by_leader.items()))
        raise Errors.CoordinatorNotAvailableError(
            f"the transaction coordinators of {TRANSACTION_LOG} {leaders}: their transactions cannot be listed "
            "until the controller moves those partitions to a serving node (seconds after it fences the node)")
    return [row for rows in listed.values() for row in rows]


def matching_transactions(admin: KafkaAdminClient, settings: KafkaSettings, id_pattern: str) -> dict[str, str]:
    """Every transactional id the coordinators know that fully matches `id_pattern`, with its state
    (Ongoing, Empty, CompleteCommit, ...): also producers that initialised but did not begin yet. Raises as
    `list_transactions` while a coordinator is away."""
    pattern = re.compile(id_pattern)
    return {t.transactional_id: t.state.value for t in list_transactions(admin, settings)
            if pattern.fullmatch(t.transactional_id)}


def transaction_log_unled(admin: KafkaAdminClient, serving: Iterable[int]) -> list[tuple[int, int]]:
    """(partition, leader id) of the partitions of Kafka's transaction log whose leader is not among the `serving`
    brokers (-1: no leader); none before any transactional producer made the log."""
    try:
        [described] = admin.describe_topics([TRANSACTION_LOG])
    except Errors.UnknownTopicOrPartitionError:
        return []
    if Errors.for_code(described.get("error_code", 0)) is Errors.UnknownTopicOrPartitionError:
        return []
    serving = set(serving)
    return sorted((p["partition_index"], p.get("leader_id", -1)) for p in described.get("partitions", [])
                  if p.get("leader_id", -1) not in serving)


def record_visible(settings: KafkaSettings, topic: str, partition: int, offset: int,
                   timeout_s: float = 30.0) -> bool | None:
    """Is the record at `offset` visible under read_committed? None: cannot tell within `timeout_s`.

    Waits until the last stable offset has passed `offset` (the transaction is decided
    and its markers are written), then reads from `offset`: a committed record comes back
    at exactly that offset, an aborted one is skipped.
    """
    tp = TopicPartition(topic, partition)
    consumer = KafkaConsumer(isolation_level="read_committed", enable_auto_commit=False, group_id=None,
                             **reachable(settings).kafka_python(KafkaConsumer))
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([tp])
        while consumer.end_offsets([tp])[tp] <= offset:  # read_committed: the last stable offset
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)
        log_start = consumer.beginning_offsets([tp])[tp]
        if log_start > offset:
            raise LookupError(f"{topic}[{partition}] no longer holds offset {offset} (log start {log_start})")
        consumer.seek(tp, offset)
        while time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=500, max_records=1).get(tp, []):
                return record.offset == offset
            if consumer.position(tp) > offset:  # moved past it without returning it: aborted
                return False
        return None
    finally:
        consumer.close()
