"""Retention: a pipeline's ledger keeps its recent history and a committed floor, not every batch forever.

A batch is pruned when it is older than `retention_days` and not among the newest
`retention_batches` (None for both keeps everything). Pruning never removes anything PLANNED or
PREPARED, the newest COMMITTED batch, a batch whose withdrawal or release is pending, or a
batch an in-flight interval re-run replaces; per partition it keeps the committed position
after what it removed (the floor), which planning, data-loss checks, rewinds and the tiling
check start from (docs/ledger.md "Retention").

Work happens in transactions of at most `chunk` batches: a running batch's compare-and-set
waits for one of them at most, and a prune killed between two leaves a whole ledger.
notify_complete prunes a bounded amount after each commit; the CLI's `prune` all of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.faults import fault_point
from airflow_exactly_once.core.ledger import Keep, Ledger, Pruned

# Batches per prune transaction: a few milliseconds of deletes, so a plan or a commit never waits long.
PRUNE_CHUNK = 200
# notify_complete prunes after its commit once at least AUTO_PRUNE_MIN batches may go (so that most commits only
# read the limit, and one in AUTO_PRUNE_MIN runs one delete transaction), and at most AUTO_PRUNE_BATCHES (one
# transaction): enough to keep up with any schedule (one batch per run) and to work off a long history bit by bit.
AUTO_PRUNE_MIN = 50
AUTO_PRUNE_BATCHES = PRUNE_CHUNK


@dataclass(frozen=True)
class Retention:
    """A pipeline's retention settings (PipelineConfig.retention_batches / retention_days)."""

    keep_batches: int | None
    keep_days: float | None

    @classmethod
    def of(cls, config: PipelineConfig) -> "Retention":
        return cls(config.retention_batches, config.retention_days)

    @classmethod
    def stored(cls, config: dict[str, Any]) -> "Retention":
        """From the config the ledger stored; a pipeline stored before retention existed has the defaults."""
        defaults = {f.name: f.default for f in fields(PipelineConfig)}
        return cls(*(config.get(name, defaults[name]) for name in ("retention_batches", "retention_days")))

    def keep(self, now: datetime | None = None) -> Keep:
        now = now or datetime.now(timezone.utc)
        since = None if self.keep_days is None else now - timedelta(days=self.keep_days)
        return Keep(self.keep_batches, since)

    def describe(self) -> str:
        if self.keep_batches is None and self.keep_days is None:
            return "retention off (retention_batches=None, retention_days=None): every batch is kept"
        parts = [f"the newest {self.keep_batches} batches" if self.keep_batches is not None else None,
                 f"the last {self.keep_days:g} days" if self.keep_days is not None else None]
        return "keeps " + " and ".join(p for p in parts if p)


@dataclass
class PruneReport:
    """What a prune removed (or, dry run, would remove) of one pipeline."""

    pipeline_id: str
    retention: Retention
    dry_run: bool
    floor_before: int
    pruned: Pruned = field(default_factory=Pruned)
    complete: bool = True  # False: stopped at `max_batches`, more is prunable

    def describe(self) -> list[str]:
        p = self.pruned
        verb = "would remove" if self.dry_run else "removed"
        if p.batches == 0 and p.through <= self.floor_before:
            return [f"{self.pipeline_id}: {self.retention.describe()}; nothing to prune (floor: batch "
                    f"{self.floor_before})"]
        lines = [f"{self.pipeline_id}: {self.retention.describe()}",
                 f"{verb} batches {self.floor_before + 1}..{p.through}: {p.batches} batches, {p.offset_rows} offset "
                 f"rows, {p.events} events, {p.resets} position resets"
                 + ("" if self.dry_run else f" in {p.transactions} transaction(s)")]
        if not self.complete:
            lines.append("stopped at the per-call bound; the rest is pruned later")
        return lines


def prune(ledger: Ledger, pipeline_id: str, retention: Retention, *, dry_run: bool = False,
          max_batches: int | None = None, min_batches: int = 1, chunk: int = PRUNE_CHUNK,
          now: datetime | None = None) -> PruneReport:
    """Prune what `retention` lets go, `chunk` batches per transaction, at most `max_batches` in all; nothing
    unless at least `min_batches` may go."""
    keep = retention.keep(now)
    floor, limit = ledger.prune_bounds(pipeline_id, keep, min_batches)
    report = PruneReport(pipeline_id, retention, dry_run, floor)
    if limit - floor < min_batches:
        limit = floor
    if max_batches is not None and limit > floor + max_batches:
        limit, report.complete = floor + max_batches, False
    if dry_run:
        report.pruned = ledger.prune_counts(pipeline_id, limit)
        return report
    report.pruned.through = floor
    while report.pruned.through < limit:
        if report.pruned.transactions:
            fault_point("prune.between_transactions")
        step = ledger.prune_chunk(pipeline_id, keep, min(chunk, limit - report.pruned.through))
        if step.through <= report.pruned.through:
            break  # the limit moved down meanwhile (a batch was planned): the rest waits for the next prune
        report.pruned.add(step)
    return report
