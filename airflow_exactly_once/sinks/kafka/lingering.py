"""A pipeline's Kafka transactions seen from outside the protocol: what `transactions list` and `abort` work on.

A ledger lost or reset, a pipeline retired with a batch open, an operator who wants to know what
holds a topic's last stable offset back: this lists the open transactions of the pipeline's
transactional ids (ListTransactions, then DescribeTransactions: state, age, producer id and
epoch, the partitions written) with the ledger batch that opened each (by the producer id its
committable recorded, else the PLANNED batch whose ids it is), and the output topic's hanging
transactions (sinks.kafka.hanging, KIP-664's find-hanging). Ending them uses the protocol's own
machinery: fencing (InitProducerId, librdkafka.fence) for a transaction its coordinator holds
open, abort markers for a hanging one, under the hanging sweep's safety rules
(hanging.why_not_abort). Every question goes through sinks.kafka.live_cluster, so a node that died a moment ago
costs a pause, not an error. A transaction of a PREPARED batch is the batch's pre-committed output:
aborting it loses the batch (recovery then finds it lost and processes the range again), so it
is refused unless forced.

No Airflow or PySpark imports: the CLI calls it with settings it resolved.
"""

from __future__ import annotations

import enum
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from kafka import KafkaAdminClient

from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks.kafka import hanging, librdkafka, probe
from airflow_exactly_once.sinks.kafka.live_cluster import LiveCluster
from airflow_exactly_once.sinks.kafka.transactional_ids import IdNaming

_HELD_OPEN = ("Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence")


def batch_label(batch: Batch | None) -> str:
    """The ledger batch a transaction belongs to, as the CLI shows it."""
    return "none" if batch is None else f"batch {batch.seq} ({batch.state.value})"


@dataclass(frozen=True)
class OpenTxn:
    """A transaction of the pipeline's ids that its coordinator holds open (or is ending)."""

    transactional_id: str
    state: str
    producer_id: int
    epoch: int
    age_s: float | None
    timeout_ms: int
    partitions: tuple[tuple[str, int], ...]
    batch: Batch | None

    def as_row(self) -> dict[str, Any]:
        return {"kind": "open", "transactional_id": self.transactional_id, "state": self.state,
                "producer_id": self.producer_id, "epoch": self.epoch,
                "age_s": None if self.age_s is None else round(self.age_s, 1), "timeout_ms": self.timeout_ms,
                "partitions": ",".join(f"{t}[{p}]" for t, p in self.partitions) or "-",
                "batch": batch_label(self.batch)}


@dataclass(frozen=True)
class HangingTxn:
    """A partition held open by a transaction its coordinator no longer works on."""

    found: hanging.Hanging
    batch: Batch | None

    def as_row(self) -> dict[str, Any]:
        txn = self.found.txn
        return {"kind": "hanging", "transactional_id": self.found.view.transactional_id or "?",
                "state": f"hanging ({self.found.outcome.value})", "producer_id": txn.producer_id, "epoch": txn.epoch,
                "age_s": None, "timeout_ms": None, "partitions": f"{txn.topic}[{txn.partition}]@{txn.start_offset}",
                "batch": batch_label(self.batch)}


@dataclass(frozen=True)
class Survey:
    open: tuple[OpenTxn, ...] = ()
    hanging: tuple[HangingTxn, ...] = ()
    scanned_topics: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class PipelineRecord:
    """What the ledger says of the pipeline's transactions (empty without a ledger)."""

    # producer id -> the batch whose committable recorded it, and every (producer id, topic, partition, first
    # offset) of that batch: the hanging sweep's Owner.
    owners: dict[int, hanging.Owner] = field(default_factory=dict)
    batches: dict[int, Batch] = field(default_factory=dict)  # by seq

    @property
    def has_ledger(self) -> bool:
        return bool(self.batches)

    def batch_of(self, producer_id: int, transactional_id: str | None, naming: IdNaming) -> Batch | None:
        """The batch whose handles recorded the producer id, else the PLANNED batch (writing) whose ids it is."""
        owner = self.owners.get(producer_id)
        if owner is not None:
            return self.batches.get(owner.batch_seq)
        for batch in self.batches.values():
            if batch.state is BatchState.PLANNED and transactional_id is not None and \
                    transactional_id.startswith(f"{naming.prefix}-") and \
                    re.fullmatch(naming.batch_pattern(batch.seq), transactional_id):
                return batch
        return None


class Outcome(str, enum.Enum):
    """What `abort` did with one transaction."""

    ENDED = "ended"
    REFUSED = "refused"
    UNKNOWN = "unknown"  # tried; whether it ended cannot be told (no answer, a timeout)


@dataclass(frozen=True)
class AbortResult:
    transactional_id: str
    what: str  # "fenced" or "abort marker"
    outcome: Outcome
    detail: str

    def as_row(self) -> dict[str, Any]:
        return {"transactional_id": self.transactional_id, "action": self.what, "outcome": self.outcome.value,
                "detail": self.detail}


def survey(live: LiveCluster, naming: IdNaming, topics: Iterable[str], record: PipelineRecord) -> Survey:
    """The pipeline's open transactions (by its id pattern) and the hanging ones of `topics`."""
    listed = live.ask(f"listing the transactions of ids {naming.prefix}-*",
                      lambda admin: probe.matching_transactions(admin, live.settings, naming.pipeline_pattern()))
    held = sorted(t for t, state in listed.items() if state in _HELD_OPEN)
    described = live.ask("describing the open transactions", lambda admin: probe.describe_transactions(admin, held))
    now_ms = time.time() * 1000
    opened = []
    for tid in held:
        found = described.get(tid)
        if found is None:  # ended meanwhile
            continue
        start = found.transaction_start_time_ms
        opened.append(OpenTxn(tid, found.state.value, found.producer_id, found.producer_epoch,
                              (now_ms - start) / 1000 if start and start > 0 else None, found.transaction_timeout_ms,
                              tuple(sorted((tp.topic, tp.partition) for tp in found.topic_partitions)),
                              record.batch_of(found.producer_id, tid, naming)))
    hung, scanned, warnings = [], [], []
    brokers = live.ask("listing the serving brokers", lambda admin: probe.serving_brokers(admin, live.settings))
    if brokers.away:  # their transactions moved to the serving nodes (listing waits until they have)
        warnings.append(f"listed from node(s) {', '.join(map(str, brokers.serving))}; {brokers.note()}")
    for topic in topics:
        try:
            found_scan = live.ask(f"looking for hanging transactions in {topic!r}", _scan_of(live.settings, topic))
        except Exception as exc:  # no READ on the topic, a leader moving: say so, list the rest
            warnings.append(f"cannot look for hanging transactions in {topic!r}: {type(exc).__name__}: {exc}")
            continue
        scanned.append(topic)
        hung += [HangingTxn(h, record.batch_of(h.txn.producer_id, None, naming)) for h in found_scan.hanging]
    return Survey(tuple(opened), tuple(hung), tuple(scanned), tuple(warnings))


def _scan_of(settings: KafkaSettings, topic: str) -> Callable[[KafkaAdminClient], hanging.Scan]:
    """The question of `topic`'s hanging transactions, for LiveCluster.ask."""
    def scan(admin: KafkaAdminClient) -> hanging.Scan:
        return hanging.scan(admin, settings, [(topic, p) for p in range(probe.topic_partitions(admin, topic))], {})
    return scan


def end(survey_: Survey, settings: KafkaSettings, live: LiveCluster, naming: IdNaming, record: PipelineRecord,
        *, only: str | None, force: bool, producer_config: dict[str, Any] | None = None,
        transaction_timeout_ms: int = 60_000) -> list[AbortResult]:
    """End the surveyed transactions (only the id `only`, if given); what happened to each."""
    results: list[AbortResult] = []
    for txn in survey_.open:
        if only is not None and txn.transactional_id != only:
            continue
        if txn.batch is not None and txn.batch.state is BatchState.PREPARED and not force:
            results.append(AbortResult(txn.transactional_id, "fence", Outcome.REFUSED,
                                       f"{batch_label(txn.batch)} is pre-committed output: notify_complete or the next "
                                       "plan's recovery commits it; aborting it loses the batch (it is then "
                                       "processed again). Add --force to abort anyway"))
            continue
        results.append(_fence(settings, live, txn, producer_config or {}, transaction_timeout_ms))
    visible_cache: dict[tuple[str, int, int], bool | None] = {}

    def visible(topic: str, partition: int, offset: int) -> bool | None:
        key = (topic, partition, offset)
        if key not in visible_cache:
            visible_cache[key] = probe.record_visible(settings, topic, partition, offset, timeout_s=5.0)
        return visible_cache[key]

    open_keys = frozenset(h.found.txn.key for h in survey_.hanging)
    for h in survey_.hanging:
        tid = h.found.view.transactional_id or f"producer id {h.found.txn.producer_id}"
        if only is not None and tid != only:
            continue
        why = _why_not(h, record, open_keys, visible, force)
        if why is not None:
            results.append(AbortResult(tid, "abort marker", Outcome.REFUSED,
                                       f"{h.found.describe()}: {why}. By hand: "
                                       f"{h.found.txn.abort_command(settings.bootstrap_servers)}"))
            continue
        try:
            hanging.abort(live.admin, [h.found])
            results.append(AbortResult(tid, "abort marker", Outcome.ENDED, h.found.txn.describe()))
        except Exception as exc:  # no answer, or a refusal: the marker may or may not be written
            results.append(AbortResult(tid, "abort marker", Outcome.UNKNOWN,
                                       f"{h.found.txn.describe()}: {type(exc).__name__}: {exc}; run `transactions "
                                       "list` again to see whether it still hangs"))
    return results


def _why_not(h: HangingTxn, record: PipelineRecord, open_keys: frozenset[tuple[int, str, int]],
             visible: hanging.Visibility, force: bool) -> str | None:
    """The sweep's rule with the ledger, and a PREPARED batch's only with --force; without a ledger (or for a
    producer it never recorded) only with --force, and never over a commit the coordinator reports."""
    if h.batch is not None and h.batch.state is BatchState.PREPARED and not force:
        return f"{batch_label(h.batch)} is pre-committed output; add --force to abort it anyway"
    owner = record.owners.get(h.found.txn.producer_id)
    if owner is not None:
        return hanging.why_not_abort(h.found, owner, open_keys, visible)
    if h.found.outcome is hanging.Outcome.COMMITTED:
        return "its coordinator committed it: an abort marker would take back committed records"
    if not force:
        return ("no ledger batch recorded this producer id" + ("" if record.has_ledger else " (no ledger given)")
                + "; add --force to write the abort marker anyway")
    return None


def _fence(settings: KafkaSettings, live: LiveCluster, txn: OpenTxn, producer_config: dict[str, Any],
           transaction_timeout_ms: int) -> AbortResult:
    """InitProducerId on the id: its coordinator aborts the open transaction and bumps the epoch; then look."""
    try:
        librdkafka.fence({**settings.librdkafka(), **producer_config}, txn.transactional_id, transaction_timeout_ms)
    except Exception as exc:
        return AbortResult(txn.transactional_id, "fence", Outcome.UNKNOWN,
                           f"{type(exc).__name__}: {exc}; the transaction may or may not be aborted, run "
                           "`transactions list` again")
    try:
        after = live.ask(f"describing {txn.transactional_id!r} after fencing it",
                         lambda admin: probe.describe_transactions(admin, [txn.transactional_id])
                         ).get(txn.transactional_id)
    except Exception as exc:  # fenced, but whether it ended cannot be seen now
        return AbortResult(txn.transactional_id, "fence", Outcome.UNKNOWN,
                           f"fenced, but its coordinator did not say whether it ended ({type(exc).__name__}: {exc}); "
                           "run `transactions list` again")
    if after is None or after.state.value in ("Empty", "CompleteAbort") or after.producer_epoch > txn.epoch:
        return AbortResult(txn.transactional_id, "fence", Outcome.ENDED,
                           f"aborted producer id {txn.producer_id} epoch {txn.epoch}"
                           + (f" ({batch_label(txn.batch)})" if txn.batch else ""))
    return AbortResult(txn.transactional_id, "fence", Outcome.UNKNOWN,
                       f"its coordinator still reports {after.state.value} at epoch {after.producer_epoch}")
