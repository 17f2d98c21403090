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
from typing import Any, Iterable

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
