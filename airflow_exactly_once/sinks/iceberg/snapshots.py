"""How a batch shows in an Iceberg table's snapshots, and the decisions the committer takes from them.

Pure logic over plain values (no catalog, no Spark), so each rule has a unit test:

* every snapshot the sink makes carries the batch id in its summary (`aeo.batch` =
  "<pipeline>:<seq>", plus the attempt, the run and the staged snapshot it came from);
* a batch is published when a snapshot of main's history carries its id: that is how
  commit recognises a batch it already published (idempotence), whichever process did it;
* a staged snapshot is published by fast-forward when main has not moved since it was
  staged, else by a cherry-pick (a new append snapshot on main with its data files);
* staged snapshots outside main's history that belong to a batch already published, or to
  another attempt of the batch being committed or aborted, are leftovers to drop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

BATCH = "aeo.batch"
PIPELINE = "aeo.pipeline"
SEQ = "aeo.batch-seq"
ATTEMPT = "aeo.attempt"
RUN = "aeo.run-id"
SOURCE = "aeo.source-snapshot-id"  # the staged snapshot a cherry-pick published
REPLACES = "aeo.replaces"  # the batch whose output a replacement withdrew in the same snapshot
RETRACTS = "aeo.retracts"  # the batch whose output a retraction withdrew
WAP_ID = "wap.id"  # Iceberg's own staged-snapshot marker (set by Spark from spark.wap.id)
FAST_FORWARD, CHERRY_PICK = "fast-forward", "cherry-pick"


def batch_key(pipeline_id: str, seq: int) -> str:
    return f"{pipeline_id}:{seq}"


def wap_id(pipeline_id: str, seq: int, epoch: int) -> str:
    """Names one write attempt's staged snapshot: the epoch of its claim tells live from zombie attempts."""
    return f"aeo:{pipeline_id}:{seq}:e{epoch}"


def batch_summary(pipeline_id: str, seq: int, epoch: int, run_id: str) -> dict[str, str]:
    """The summary properties of every snapshot that stages or publishes this batch."""
    return {BATCH: batch_key(pipeline_id, seq), PIPELINE: pipeline_id, SEQ: str(seq), ATTEMPT: str(epoch),
            RUN: run_id}


@dataclass(frozen=True)
class SnapshotView:
    """What the decisions need of a snapshot."""

    snapshot_id: int
    parent_id: int | None
    summary: Mapping[str, str] = field(default_factory=dict)

    @property
    def batch(self) -> str | None:
        return self.summary.get(BATCH)


def find_published(main_history: Iterable[SnapshotView], key: str) -> SnapshotView | None:
    """The snapshot of main's history that published batch `key`, else None."""
    return next((s for s in main_history if s.batch == key), None)


def publish_mode(staged_parent: int | None, main_head: int | None) -> str:
    """Fast-forward when main is still where the batch was staged from; else cherry-pick its files.

    Appends commute, so a cherry-pick onto a main that other batches moved (parallel
    interval runs) adds exactly the batch's rows; the compare-and-set on main's head
    makes a racing commit of the same batch fail, re-check and find it published.
    """
    return FAST_FORWARD if staged_parent == main_head else CHERRY_PICK


def leftovers(snapshots: Iterable[SnapshotView], main_ids: set[int], ref_heads: set[int], pipeline_id: str,
              batches: set[str], published: set[str]) -> list[int]:
    """Staged snapshots of `pipeline_id` to drop: outside main's history and every ref, of a batch in
    `batches` (the one being committed or aborted) or already `published` (zombie attempts)."""
    return [s.snapshot_id for s in snapshots
            if s.snapshot_id not in main_ids and s.snapshot_id not in ref_heads
            and s.summary.get(PIPELINE) == pipeline_id and s.batch is not None
            and (s.batch in batches or s.batch in published)]


def withdrawal(batch_files: set[str], live_files: set[str]) -> str:
    """What retracting a batch whose published snapshot added `batch_files` means now.

    "done" when none is live (withdrawn before), "all" when all are, "partial" when some were
    rewritten meanwhile (compaction), which no exact withdrawal can undo.
    """
    live = batch_files & live_files
    if not live:
        return "done"
    return "all" if live == batch_files else "partial"
