"""The tiling check of invariant 1 (docs/protocol.md), on the ledger alone.

Committed ranges leave no gap and no overlap.

Continuation pipelines: walking batches in order from where the partition started (or from
the committed floor retention left), each committed range of a partition starts where the
previous one ended, or where a recorded position reset (a rewind, data loss accepted under
data_loss_policy="skip") put the position. Interval pipelines: each
committed range runs between its interval's fixed boundaries, one committed batch per
interval, and no two committed ranges overlap. Anything else is reported as a problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.states import BatchState


@dataclass
class AuditReport:
    pipeline_id: str
    committed_batches: int = 0
    problems: list[str] = field(default_factory=list)
    # Recorded, deliberate discontinuities (rewinds, accepted data loss), for the reader.
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def audit_pipeline(ledger: Ledger, pipeline_id: str) -> AuditReport:
    report = AuditReport(pipeline_id)
    committed = ledger.list_batches(pipeline_id, [BatchState.COMMITTED], newest_first=False)
    report.committed_batches = len(committed)
    for batch in ledger.open_work(pipeline_id).retractions:
        report.problems.append(f"batch {batch.seq} is RETRACTED but its output was not withdrawn yet (the next "
                               "run's recovery does it)")
    if ledger.count_batches(pipeline_id, with_interval=True):
        _audit_intervals(ledger, pipeline_id, committed, report)
    else:
        _audit_continuation(ledger, pipeline_id, committed, report)
    return report


def _audit_continuation(ledger: Ledger, pipeline_id: str, committed: list[Batch], report: AuditReport) -> None:
    position = ledger.initial_offsets(pipeline_id)
    floor = ledger.retention_floor(pipeline_id)
    if floor.batch_seq:  # what retention pruned tiled up to the floor; the kept batches continue from it
        position.update(floor.offsets)
        shown = ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(floor.offsets.items()))
        report.notes.append(f"batches up to {floor.batch_seq} were pruned by retention; tiling is checked from the "
                            f"committed floor {shown}")
    # A reset recorded after batch n applies before batch n + 1: order resets at n + 0.5.
    steps: list[tuple[float, Batch | dict[str, Any]]] = [(b.seq, b) for b in committed]
    steps += [(r["after_batch_seq"] + 0.5, r) for r in ledger.position_resets(pipeline_id)]
    for _, step in sorted(steps, key=lambda s: s[0]):
        if isinstance(step, dict):
            tp = (step["topic"], step["partition"])
            report.notes.append(f"{step['kind']} after batch {step['after_batch_seq']}: {tp[0]}[{tp[1]}] "
                                f"{position.get(tp)} -> {step['new_offset']} ({step['reason']})")
            position[tp] = step["new_offset"]
            continue
        for r in step.ranges:
            expected = position.get((r.topic, r.partition))
            if expected is None:
                report.problems.append(f"batch {step.seq}: {r.topic}[{r.partition}] has no recorded start")
            elif r.start != expected:
                kind = "gap" if r.start > expected else "overlap"
                report.problems.append(f"batch {step.seq}: {r.topic}[{r.partition}] starts at {r.start}, expected "
                                       f"{expected} ({kind} of {abs(r.start - expected)} offsets)")
            position[(r.topic, r.partition)] = r.end


def _audit_intervals(ledger: Ledger, pipeline_id: str, committed: list[Batch], report: AuditReport) -> None:
    fixed = ledger.list_boundaries(pipeline_id)
    seen: dict[tuple[int, int], int] = {}
    spans: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for batch in committed:
        interval = ledger.batch_interval(batch.id)
        if interval is None:
            report.problems.append(f"batch {batch.seq} has no data interval in an interval pipeline")
            continue
        if interval in seen:
            report.problems.append(f"interval {interval} is committed twice: batches {seen[interval]} and {batch.seq}")
        seen[interval] = batch.seq
        for r in batch.ranges:
            tp = (r.topic, r.partition)
            bounds = (fixed.get((tp, interval[0])), fixed.get((tp, interval[1])))
            if (r.start, r.end) != bounds:
                if batch.skipped:
                    report.notes.append(f"batch {batch.seq}: {r.topic}[{r.partition}] {r.start}..{r.end} instead of "
                                        f"{bounds[0]}..{bounds[1]} (data loss accepted)")
                else:
                    report.problems.append(f"batch {batch.seq}: {r.topic}[{r.partition}] {r.start}..{r.end} does not "
                                           f"match its interval's boundaries {bounds[0]}..{bounds[1]}")
            if r.size:
                spans.setdefault(tp, []).append((r.start, r.end, batch.seq))
    for (topic, partition), items in spans.items():
        items.sort()
        for (_, end, seq), (start, _, next_seq) in zip(items, items[1:]):
            if start < end:
                report.problems.append(f"batches {seq} and {next_seq} overlap in {topic}[{partition}] "
                                       f"({start}..{end - 1})")
