"""Rewinding a continuation pipeline: move its position back so that a range is processed again.

Two ways to treat the output already committed for that range:
  * "retract" (default): the committed batches that hold records at or after the target
    are withdrawn from the sink, so after reprocessing the output holds every record
    exactly once. Batches are the unit of output, so the position goes back to the start
    of the first withdrawn batch (at or before the target); the plan says where.
  * "keep": the output stays and the range is delivered again (consumers see it twice).
    The overlap is recorded as a deliberate reset, so the tiling check accepts it.

The ledger records the rewind first (batches RETRACTED, position resets, epoch + 1) and the
sink withdraws the output after; if that is interrupted, the next run's recovery finishes
it before planning anything, so new output never meets the old.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_exactly_once.core.errors import ConfigurationError, FencedError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.core.states import BatchState

TopicPartition = tuple[str, int]
OUTPUT_MODES = ("retract", "keep")


@dataclass
class RewindPlan:
    pipeline_id: str
    output: str
    epoch: int
    before: dict[TopicPartition, int]
    after: dict[TopicPartition, int]
    retract: list[Batch] = field(default_factory=list)

    @property
    def moves(self) -> dict[TopicPartition, tuple[int, int]]:
        return {tp: (self.before[tp], self.after[tp]) for tp in sorted(self.after)
                if self.after[tp] != self.before.get(tp)}

    def describe(self) -> list[str]:
        lines = [f"{t}[{p}]: {old} -> {new} ({old - new} offsets to process again)"
                 for (t, p), (old, new) in self.moves.items()]
        if not lines:
            lines.append("nothing to rewind: every partition is already at or before the target")
        if self.retract:
            lines.append("committed batches withdrawn from the sink: "
                         + ", ".join(f"{b.seq} ({b.output_records} records)" for b in self.retract))
        elif self.output == "keep" and lines:
            lines.append("committed output is kept: the rewound range will be delivered again")
        return lines


def plan_rewind(ledger: Ledger, pipeline_id: str, targets: dict[TopicPartition, int], output: str = "retract",
                log_starts: dict[TopicPartition, int] | None = None) -> RewindPlan:
    """Check a rewind to `targets` and work out its effect, changing nothing."""
    pipeline = ledger.pipeline(pipeline_id)
    if pipeline is None:
        known = ", ".join(p["pipeline_id"] for p in ledger.list_pipelines()) or "none"
        raise ConfigurationError(f"no pipeline {pipeline_id!r} in this ledger (known: {known})")
    if output not in OUTPUT_MODES:
        raise ConfigurationError(f"output={output!r}: choose one of {', '.join(OUTPUT_MODES)}")
    if ledger.count_batches(pipeline_id, with_interval=True):
        raise ConfigurationError(f"pipeline {pipeline_id} plans by data interval and has no position to rewind: "
                                 "re-run the intervals instead (an Airflow backfill with 'reprocess completed' "
                                 "runs, and interval_rerun='replace')")
    in_flight = ledger.list_batches(pipeline_id, [BatchState.PLANNED, BatchState.PREPARED])
    if in_flight:
        busy = in_flight[-1]
        raise FencedError(f"batch {busy.seq} of run {busy.run_id} is {busy.state.value}: a rewind must not move "
                          "offsets under a batch in flight; let that run finish (or fail and abort), then rewind")
    positions = ledger.committed_positions(pipeline_id)
    floor = ledger.retention_floor(pipeline_id)
    if not targets:
        raise ConfigurationError("no target offsets: give offsets per partition, or a time that has records")
    for tp, offset in sorted(targets.items()):
        name = f"{tp[0]}[{tp[1]}]"
        if tp not in positions:
            known = ", ".join(f"{t}[{p}]" for t, p in sorted(positions)) or "none"
            raise ConfigurationError(f"{name} is not a partition of pipeline {pipeline_id} (known: {known})")
        if offset > positions[tp]:
            raise ConfigurationError(f"{name}: offset {offset} is past the committed position {positions[tp]}; a "
                                     "rewind only moves back (skipping data is not a rewind)")
        if output == "retract" and offset < floor.offsets.get(tp, offset):
            raise ConfigurationError(
                f"{name}: offset {offset} is below the retention floor {floor.offsets[tp]}: the batches that "
                f"committed those records (up to batch {floor.batch_seq}) were pruned by retention, so their output "
                f"cannot be withdrawn; rewind to {floor.offsets[tp]} or later, or with output 'keep' (the range is "
                "delivered again). Keep more history with retention_batches / retention_days")
        if log_starts is not None and offset < log_starts.get(tp, 0):
            raise ConfigurationError(f"{name}: offset {offset} is no longer in the topic (log start is "
                                     f"{log_starts[tp]}); rewind to {log_starts[tp]} or later")
    after = dict(positions)
    retract: list[Batch] = []
    if output == "keep":
        after.update(targets)
    else:
        committed = ledger.list_batches(pipeline_id, [BatchState.COMMITTED], newest_first=False)
        first = next((b for b in committed if any(r.size and r.end > targets.get((r.topic, r.partition), r.end)
                                                  for r in b.ranges)), None)
        retract = [b for b in committed if first is not None and b.seq >= first.seq]
        for batch in retract:
            for r in batch.ranges:
                after[(r.topic, r.partition)] = min(after[(r.topic, r.partition)], r.start)
        for tp, offset in targets.items():
            after[tp] = min(after[tp], offset)
    return RewindPlan(pipeline_id, output, pipeline["epoch"], positions, after, retract)


def apply_rewind(ledger: Ledger, sink: SinkCommitter, plan: RewindPlan, reason: str) -> list[str]:
    """Record the rewind, then withdraw the output. Fails (changing nothing) if the pipeline moved meanwhile."""
    if plan.retract and not sink.supports_retract:
        raise ConfigurationError(f"the {sink.type_name} sink cannot withdraw committed output; rewind with "
                                 "output='keep' (the range is delivered again) instead")
    resets = {tp: (new, f"{reason} (output {plan.output})") for tp, (_, new) in plan.moves.items()}
    if not resets and not plan.retract:
        return ["nothing to do"]
    try:
        ledger.rewind(plan.pipeline_id, expected_epoch=plan.epoch, retract=[b.seq for b in plan.retract],
                      resets=resets, reason=reason)
    except FencedError as exc:
        if exc.retriable:
            raise FencedError(f"pipeline {plan.pipeline_id} changed while the rewind was prepared (a run planned "
                              "or committed meanwhile); nothing was changed: check and rewind again") from exc
        raise
    return finish_retractions(ledger, sink, plan.pipeline_id)


def finish_retractions(ledger: Ledger, sink: SinkCommitter, pipeline_id: str, pending: list[Batch] | None = None) -> list[str]:
    """Withdraw the output of RETRACTED batches not yet confirmed withdrawn. Idempotent.

    `pending`: those batches as the caller just read them (Ledger.open_work); None reads them here.
    """
    done = []
    for batch in ledger.open_work(pipeline_id).retractions if pending is None else pending:
        message = sink.retract(batch, sink.committable(batch.handles))
        ledger.update_details(batch.id, output_retracted=True)
        done.append(f"batch {batch.seq}: {message}")
    return done
