"""Which transactional ids a Kafka sink's batches use: a fixed pool reused across batches (Flink's POOLING naming).

Pooled ids are `<prefix>-<slot>-<spark partition>`, slot = batch_seq mod `transactional_id_slots`,
so a pipeline's ids on the coordinators are at most slots x partitions, whatever its history
(the first releases named them `<prefix>-<batch_seq>-<partition>`: a new set per batch, each
kept by the broker for `transactional.id.expiration.ms`). `transactional_ids="per_batch"` keeps
the old naming. The two namings share their form on purpose: batch n < slots of an old ledger
used exactly slot n's ids, and the rule below, which compares seqs mod slots, covers it too.

Why reuse is safe. InitProducerId on an id aborts the transaction that id holds open and bumps
its epoch, so an id may be reused only once the transaction it last carried has ended. Which
batches can hold transactions open at the same time:

- the batch being written (PLANNED), its PREPARED successor-to-be, and any PREPARED batch of
  another data interval (range_mode="interval" runs intervals side by side, a backfill many);
- an ABORTED batch whose release (fencing its ids) is still pending;
- zombie writers of an earlier attempt (a Spark task that outlived its write task).

In range_mode="continuation" a plan supersedes (aborts, releases) every PLANNED batch and
recovers every PREPARED one before it creates the next batch, so one batch is open at a time; in
interval mode any number may be. Hence the rule (`slot_holders`), checked by the write before
any producer is opened: a batch writes only when no earlier batch with its slot is PLANNED,
PREPARED or waiting for its release; else the write fails, retriable, naming the holder. A
batch's seq is fixed when it is created, and PLANNED/PREPARED come only before ABORTED/COMMITTED,
so the rule has no race: an earlier batch that is ended stays ended, a later one waits for this.

Fencing and recovery keep working: a write attempt's retry uses the same ids as the attempt it
replaces and fences it (as before); a batch's release fences its slot's ids, which no other
open batch holds by the rule; a PREPARED batch is committed from the producer id and epoch its
committable recorded, whatever the id's name, so batches named the old way still commit. The
residue, written down in docs/sinks/kafka.md: a zombie that passed its claim check just before
its batch was aborted, or a second late release of the same batch, can still initialise a slot
id after a later batch took the slot over; that aborts the later batch's transaction, which
notify_complete then finds lost (the range is processed again) or, in the instant between
judging and committing, reports as a PARTIAL COMMIT and leaves for a human. The claim is
checked right before InitProducerId to keep that window to one round trip, and a release skips
a slot a later batch holds.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from airflow_exactly_once.core.errors import ConfigurationError, SinkError
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import LedgerReader
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.records.bad_records import DEAD_LETTER_SUFFIX

POOLED = "pooled"
PER_BATCH = "per_batch"
DEFAULT_SLOTS = 4
OPEN_STATES = (BatchState.PLANNED, BatchState.PREPARED)


def per_batch_id(prefix: str, batch_seq: int, partition: int) -> str:
    """The first releases' naming: one id per (pipeline, batch, Spark partition)."""
    return f"{prefix}-{batch_seq}-{partition}"


def pooled_id(prefix: str, slot: int, partition: int) -> str:
    """Pooled naming: one id per (pipeline, slot, Spark partition), reused by every batch of the slot."""
    return f"{prefix}-{slot}-{partition}"


@dataclass(frozen=True)
class IdNaming:
    """How one Kafka output names its transactional ids; picklable (it travels to the executors)."""

    prefix: str
    scheme: str = POOLED
    slots: int = DEFAULT_SLOTS

    def __post_init__(self) -> None:
        if self.scheme not in (POOLED, PER_BATCH):
            raise ConfigurationError(f"kafka sink: transactional_ids={self.scheme!r} is not a naming; use "
                                     f"{POOLED!r} (a fixed pool of ids) or {PER_BATCH!r} (new ids per batch)")
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 2:
            raise ConfigurationError(f"kafka sink: transactional_id_slots={self.slots!r} must be a whole number of "
                                     "at least 2 (a batch and its successor never share ids); use more than the "
                                     "number of data intervals run at once (max_active_runs) in interval mode")

    @property
    def pooled(self) -> bool:
        return self.scheme == POOLED

    def slot(self, batch_seq: int) -> int | None:
        """The batch's slot under pooled naming (None: per-batch ids)."""
        return batch_seq % self.slots if self.pooled else None

    def transactional_id(self, batch_seq: int, partition: int) -> str:
        slot = self.slot(batch_seq)
        if slot is None:
            return per_batch_id(self.prefix, batch_seq, partition)
        return pooled_id(self.prefix, slot, partition)

    def batch_pattern(self, batch_seq: int) -> str:
        """A regex that fully matches every id the batch may have used: its slot's, and the per-batch ids a
        release before pooling gave it (a batch planned before an upgrade)."""
        slot = self.slot(batch_seq)
        numbers = str(batch_seq) if slot is None or slot == batch_seq else f"(?:{batch_seq}|{slot})"
        return re.escape(f"{self.prefix}-") + numbers + r"-\d+"

    def pipeline_pattern(self) -> str:
        """A regex that fully matches every id of the pipeline under either naming."""
        return re.escape(f"{self.prefix}-") + r"\d+-\d+"

    def slot_holders(self, batch: Batch, ledger: LedgerReader) -> list[Batch]:
        """Earlier batches that may still hold the ids `batch` would use (PLANNED, PREPARED or not released)."""
        slot = self.slot(batch.seq)
        if slot is None:
            return []
        maybe_open = ledger.list_batches(batch.id.pipeline_id, OPEN_STATES) + \
            ledger.pending_releases(batch.id.pipeline_id)
        return sorted((b for b in maybe_open if b.seq < batch.seq and self.slot(b.seq) == slot),
                      key=lambda b: b.seq)

    def later_holders(self, batch: Batch, ledger: LedgerReader) -> list[Batch]:
        """Later open batches of the same slot: they took it over, so releasing `batch` must not fence it."""
        slot = self.slot(batch.seq)
        if slot is None:
            return []
        return sorted((b for b in ledger.list_batches(batch.id.pipeline_id, OPEN_STATES)
                       if b.seq > batch.seq and self.slot(b.seq) == slot), key=lambda b: b.seq)

    def ensure_free(self, batch: Batch, ledger: LedgerReader | None) -> None:
        """Raise (retriable) when an earlier batch still holds this batch's slot; without a ledger, allow."""
        if ledger is None:
            return
        holders = self.slot_holders(batch, ledger)
        slot = self.slot(batch.seq)
        if holders and slot is not None:
            shown = ", ".join(f"batch {b.seq} ({b.state.value}, run {b.run_id})" for b in holders)
            raise SinkError(
                f"batch {batch.seq} would reuse the transactional ids {pooled_id(self.prefix, slot, 0)}, ... "
                f"(slot {slot} of {self.slots}) that {shown} may still hold open; it writes once "
                f"that batch is committed or aborted (retry this task). If this happens often, more batches are "
                f"open at once than slots: raise transactional_id_slots above max_active_runs", retriable=True)


@dataclass(frozen=True)
class UsedNaming:
    """How a batch's handles say its ids were named: `slot` None for per-batch ids; `slots` None when they do not
    record the slot count (handles of releases before it was recorded)."""

    seq: int
    slot: int | None
    slots: int | None

    def differs_from(self, naming: IdNaming) -> bool:
        """Were the batch's pooled ids named with another slot count than `naming`'s? Per-batch ids are not: the
        upgrade to pooling keeps them safe by design (module docstring)."""
        if not naming.pooled or self.slot is None:
            return False
        if self.slots is not None:
            return self.slots != naming.slots
        return self.slot != naming.slot(self.seq)  # the count unrecorded: only a slot that disagrees shows it

    def described(self) -> str:
        return f"{self.slots} slots" if self.slots is not None else f"slot {self.slot} for batch {self.seq}"


def refuse_changed_slots(naming: IdNaming, pipeline_id: str, ledger: LedgerReader | None,
                         used: Callable[[], dict[int, UsedNaming]]) -> None:
    """Refuse (at plan) a transactional_id_slots that differs from the one a still-open batch's ids were named with.

    With no batch open a new count is harmless: every id of the old count has ended. With one open
    (PLANNED, PREPARED, or ABORTED with its release pending), the new count names its ids otherwise:
    its release would fence the wrong ids and leave its own open until they time out, and the slot
    rule, comparing seqs by the new count, could let a new batch initialise (and so abort) its open
    transactions. A batch with handles is judged by what they record; a PLANNED one has none yet, so
    by the newest batch's that does (the naming its write most likely used). `used`: by seq, from the
    ledger's history, read only when a batch is open.
    """
    if ledger is None or not naming.pooled:
        return
    still_open = {b.seq: b for b in [*ledger.list_batches(pipeline_id, OPEN_STATES),
                                     *ledger.pending_releases(pipeline_id)]}
    if not still_open:
        return
    recorded = used()
    newest = max((u for u in recorded.values() if u.slot is not None), key=lambda u: u.seq, default=None)
    unsafe: list[tuple[Batch, UsedNaming, bool]] = []  # the batch, the naming judged, whether its own handles say it
    for seq, batch in sorted(still_open.items()):
        judged = recorded.get(seq, newest)
        if judged is not None and judged.differs_from(naming):
            unsafe.append((batch, judged, seq in recorded))
    if not unsafe:
        return
    shown = ", ".join(f"batch {b.seq} ({b.state.value}; its ids named with {u.described()}"
                      + ("" if own else f", as batch {u.seq} recorded: its write has recorded nothing yet") + ")"
                      for b, u, own in unsafe)
    old = next((u.slots for _, u, _ in unsafe if u.slots is not None), None)
    back = f"transactional_id_slots={old}" if old is not None else "the transactional_id_slots they were written with"
    raise ConfigurationError(
        f"kafka sink: transactional_id_slots={naming.slots} differs from the count the still open {shown} of "
        f"pipeline {pipeline_id!r} used. The new count names an open batch's transactional ids otherwise: its "
        "release would miss its open transactions, and a new batch could reuse (and so abort) them. Finish or "
        f"abort the open batch first: go back to {back} and let a run commit or abort it (a plan recovers a "
        "PREPARED batch and aborts another run's PLANNED one), then change the count while no batch is open "
        f"(`airflow-exactly-once batches {pipeline_id} --state PLANNED --state PREPARED` shows them); "
        "docs/sinks/kafka.md, Transactional ids", retriable=False)


def naming_of(spec: dict[str, Any], prefix: str) -> IdNaming:
    """The naming a Kafka sink's spec asks for."""
    return IdNaming(prefix, spec.get("transactional_ids") or POOLED,
                    DEFAULT_SLOTS if spec.get("transactional_id_slots") is None else spec["transactional_id_slots"])


def prefix_users(prefix: str, pipelines: Iterable[dict[str, Any]], pipeline_id: str) -> list[str]:
    """The ledger's other pipelines whose Kafka sinks (or dead-letter sinks) use `prefix` for their ids."""
    users = []
    for row in pipelines:
        other = row.get("pipeline_id")
        if other == pipeline_id:
            continue
        config = row.get("config") or {}
        if isinstance(config, str):  # Ledger.list_pipelines gives the stored text
            config = json.loads(config)
        if prefix in _prefixes(config, str(other)):
            users.append(str(other))
    return sorted(users)


def _prefixes(config: dict[str, Any], pipeline_id: str) -> set[str]:
    """The transactional id prefixes a stored pipeline config's Kafka sinks use."""
    found = set()
    for spec, default in ((config.get("sink"), pipeline_id), (config.get("dead_letter"), pipeline_id + DEAD_LETTER_SUFFIX)):
        if isinstance(spec, dict) and spec.get("type") == "kafka":
            found.add(str(spec.get("transactional_id_prefix") or default))
    return found
