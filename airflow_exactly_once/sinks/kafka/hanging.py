"""Hanging transactions (KIP-664): open in a partition, finished or forgotten at the coordinator.

A transaction is hanging when a partition leader still holds it open (DescribeProducers: a producer
with a current transaction start offset) while its coordinator no longer does: it reports the
transactional id aborted or committed, empty, dead, at a newer producer id or epoch, or does not know
the producer at all. The abort or commit markers never reached that partition (a broker killed while
the coordinator wrote them, the coordinator's own state lost), so its last stable offset stays at the
transaction's first record for good: read_committed consumers of the partition see nothing after it,
and the coordinator never times out a transaction it already considers finished.

Ending one takes an abort marker written by an admin client (WriteTxnMarkers, what Kafka's admin
`abortTransaction` and `kafka-transactions.sh abort` send; the principal needs ALTER on the Cluster).
This module finds hanging transactions, tells what the coordinator says of each, decides whether an
abort is safe for a producer the caller can show to be its own, and writes the markers. Order matters
when looking: partitions first, then the coordinators, then the partitions again; a coordinator that
finished a transaction had every marker acknowledged before it said so, so a partition that still shows
the transaction open after that is hanging, not merely slow.

No Airflow or PySpark imports: any process that commits or aborts a Kafka batch uses it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Iterable

from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import AbortTransactionSpec

from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks.kafka import probe

# Coordinator states in which the transaction is still being worked on: not hanging (yet).
_UNDER_WAY = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")

TopicPartitionKey = tuple[str, int]


class Outcome(str, enum.Enum):
    """What the coordinator's answer means for a transaction a partition holds open."""

    UNDER_WAY = "under way"  # open or being ended at the coordinator: not hanging
    ABORTED = "aborted"  # the coordinator aborted it: an abort marker is what the partition lacks
    COMMITTED = "committed"  # the coordinator committed it: aborting it would undo a commit
    UNKNOWN = "unknown"  # forgotten, or the id moved on: only the caller's own records can decide


@dataclass(frozen=True)
class OpenTransaction:
    """A transaction a partition leader holds open (one row of DescribeProducers)."""

    topic: str
    partition: int
    producer_id: int
    epoch: int
    coordinator_epoch: int
    start_offset: int

    @property
    def key(self) -> tuple[int, str, int]:
        return self.producer_id, self.topic, self.partition

    def describe(self) -> str:
        return (f"{self.topic}[{self.partition}] producer id {self.producer_id} epoch {self.epoch} "
                f"(open since offset {self.start_offset})")

    def abort_command(self, bootstrap_servers: str) -> str:
        """What an operator runs to end it by hand (Kafka's own tool; the coordinator epoch as it takes it)."""
        return (f"kafka-transactions.sh --bootstrap-server {bootstrap_servers} abort --topic {self.topic} "
                f"--partition {self.partition} --producer-id {self.producer_id} --producer-epoch {self.epoch} "
                f"--coordinator-epoch {max(self.coordinator_epoch, 0)}")


@dataclass(frozen=True)
class CoordinatorView:
    """What the coordinators say of a producer id: its transactional id's state, or nothing at all."""

    transactional_id: str | None = None
    state: str | None = None  # None: no coordinator knows the producer id
    producer_id: int = -1
    epoch: int = -1

    def outcome(self, txn: OpenTransaction, partition_listed: bool) -> Outcome:
        if self.state is None or self.producer_id != txn.producer_id:
            return Outcome.UNKNOWN
        if self.epoch < txn.epoch:  # cannot be: the partition saw a newer epoch than the coordinator
            return Outcome.UNKNOWN
        if self.state in _UNDER_WAY:
            # Ongoing at the same epoch and with this partition in the transaction: being written.
            if self.epoch == txn.epoch and (self.state != "Ongoing" or partition_listed):
                return Outcome.UNDER_WAY
            return Outcome.UNKNOWN
        if self.state == "CompleteAbort":
            return Outcome.ABORTED
        if self.state == "CompleteCommit" and self.epoch == txn.epoch:
            return Outcome.COMMITTED
        return Outcome.UNKNOWN  # Empty, Dead, or a commit at a later epoch: says nothing of this one

    def describe(self) -> str:
        if self.state is None:
            return "no transaction coordinator knows this producer id"
        return (f"its coordinator reports transactional id {self.transactional_id!r} {self.state} "
                f"(producer id {self.producer_id}, epoch {self.epoch})")


@dataclass(frozen=True)
class Hanging:
    """An open transaction its coordinator no longer works on."""

    txn: OpenTransaction
    view: CoordinatorView
    outcome: Outcome

    def describe(self) -> str:
        return f"{self.txn.describe()}: {self.view.describe()}"


def open_transactions(admin: KafkaAdminClient, partitions: Iterable[TopicPartitionKey]) -> list[OpenTransaction]:
    """Every transaction the leaders of `partitions` hold open. Raises KafkaError when a leader refuses
    (no READ on the topic: TopicAuthorizationFailedError) or cannot answer now."""
    wanted = [TopicPartition(t, p) for t, p in partitions]
    if not wanted:
        return []
    described = admin.describe_producers(wanted)
    return sorted((OpenTransaction(tp.topic, tp.partition, s.producer_id, s.producer_epoch, s.coordinator_epoch,
                                   s.current_transaction_start_offset)
                   for tp in wanted for s in described[tp].active_producers
                   if s.current_transaction_start_offset >= 0),
                  key=lambda t: (t.topic, t.partition, t.start_offset))


def coordinator_views(admin: KafkaAdminClient, settings: KafkaSettings, producer_ids: Iterable[int],
                      known_ids: dict[int, str]) -> dict[int, tuple[CoordinatorView, set[TopicPartitionKey]]]:
    """Per producer id: what its coordinator says, and the partitions it lists in the transaction.

    `known_ids` maps producer ids to the transactional ids the caller recorded; the others are looked
    up with ListTransactions filtered by producer id (probe.list_transactions: every serving broker; it raises,
    retriable, while a coordinator is away, so that an id is never taken for unknown because its coordinator did not
    answer). A producer id no coordinator lists, or a transactional id its coordinator no longer knows, gets an empty
    view.
    """
    wanted = sorted(set(producer_ids))
    ids = {pid: known_ids[pid] for pid in wanted if pid in known_ids}
    unlisted = [pid for pid in wanted if pid not in ids]
    if unlisted:
        ids.update({row.producer_id: row.transactional_id
                    for row in probe.list_transactions(admin, settings, producer_id_filters=unlisted)
                    if row.producer_id in unlisted})
    described = probe.describe_transactions(admin, sorted(set(ids.values())))
    views: dict[int, tuple[CoordinatorView, set[TopicPartitionKey]]] = {}
    for pid in wanted:
        found = described.get(ids.get(pid, ""))
        if found is None:
            views[pid] = (CoordinatorView(ids.get(pid)), set())
        else:
            views[pid] = (CoordinatorView(ids[pid], found.state.value, found.producer_id, found.producer_epoch),
                          {(tp.topic, tp.partition) for tp in found.topic_partitions})
    return views


@dataclass(frozen=True)
class Scan:
    """What a look at some partitions found: the hanging transactions, and every (producer id, topic,
    partition) held open at the last look (the partitions where those producers have no marker yet)."""

    hanging: tuple[Hanging, ...] = ()
    open_keys: frozenset[tuple[int, str, int]] = frozenset()


def scan(admin: KafkaAdminClient, settings: KafkaSettings, partitions: Iterable[TopicPartitionKey],
         known_ids: dict[int, str]) -> Scan:
    """The hanging transactions of `partitions`: held open by their leaders, not by their coordinators."""
    partitions = sorted(set(partitions))
    seen = open_transactions(admin, partitions)
    if not seen:
        return Scan()
    views = coordinator_views(admin, settings, {t.producer_id for t in seen}, known_ids)
    suspects = {}
    for txn in seen:
        view, listed = views[txn.producer_id]
        outcome = view.outcome(txn, (txn.topic, txn.partition) in listed)
        if outcome is not Outcome.UNDER_WAY:
            suspects[txn.key] = Hanging(txn, view, outcome)
    if not suspects:
        return Scan((), frozenset(t.key for t in seen))
    # Looked at again after the coordinators: what was only slow to receive its markers is closed by now.
    again = {t.key: t for t in open_transactions(admin, partitions)}
    hanging = tuple(h for key, h in suspects.items() if key in again and again[key].epoch == h.txn.epoch)
    return Scan(hanging, frozenset(again))


@dataclass(frozen=True)
class Owner:
    """The batch of this pipeline whose write opened a producer id, as its ledger recorded it."""

    batch_seq: int
    committed: bool  # the ledger says the batch's output was committed
    # Every transaction of that batch in this topic: (producer id, topic, partition, its first offset there).
    writes: tuple[tuple[int, str, int, int], ...]


# Whether the record at (topic, partition, offset) is visible to read_committed readers: True, False, or
# None when that cannot be told now (the partition's last stable offset has not passed it).
Visibility = Callable[[str, int, int], "bool | None"]


def why_not_abort(hanging: Hanging, owner: Owner | None, open_keys: frozenset[tuple[int, str, int]],
                  visible: Visibility) -> str | None:
    """None when an abort marker is safe for `hanging`, else why not.

    Safe: the producer is the pipeline's own and its batch was never committed by the ledger, and either
    the coordinator says the transaction was aborted, or nothing says it was committed: no partition the
    batch wrote shows a commit marker of any of the batch's producers (a commit the coordinator accepted
    before it lost its state must not be half undone).
    """
    pid = hanging.txn.producer_id
    if owner is None:
        return (f"producer id {pid} is not one this pipeline's ledger recorded (a write attempt that died before "
                "it recorded its transactions, or another application writing to the topic)")
    if hanging.outcome is Outcome.COMMITTED:
        return "its coordinator committed it: an abort marker would take back committed records"
    if owner.committed:
        return f"the ledger says batch {owner.batch_seq}, which wrote it, was committed"
    if hanging.outcome is Outcome.ABORTED:
        return None
    for producer_id, topic, partition, offset in owner.writes:
        if (producer_id, topic, partition) in open_keys:
            continue  # no marker of this producer there yet
        shown = visible(topic, partition, offset)
        if shown is None:
            return (f"whether {topic}[{partition}] holds a commit of batch {owner.batch_seq} (producer id "
                    f"{producer_id}, offset {offset}) cannot be told: another open transaction holds its last "
                    "stable offset back")
        if shown:
            return (f"{topic}[{partition}] shows batch {owner.batch_seq}'s records of producer id {producer_id} "
                    "committed: its commit was accepted before the coordinator lost it, and aborting the rest "
                    "would half undo it")
    return None


def abort(admin: KafkaAdminClient, hanging: Iterable[Hanging]) -> list[OpenTransaction]:
    """Write an abort marker for each (one WriteTxnMarkers to the partition's leader); what was aborted.

    Raises ClusterAuthorizationFailedError when the principal lacks ALTER on the Cluster, other
    KafkaErrors when a leader refuses (a marker for an epoch the partition has moved past, say).
    """
    done = []
    for h in hanging:
        txn = h.txn
        admin.abort_transaction(AbortTransactionSpec(TopicPartition(txn.topic, txn.partition), txn.producer_id,
                                                     txn.epoch, txn.coordinator_epoch))
        done.append(txn)
    return done
