"""The two-phase commit of one batch, step by step, on top of the ledger and a sink.

Flink's TwoPhaseCommitSinkFunction mapped onto Airflow tasks:
  plan            = initializeState (recover and commit PREPARED batches) + fix the range
  write           = snapshotState -> preCommit (see airflow_exactly_once.spark.job)
  notify_complete = notifyCheckpointComplete -> commit, then advance the offsets
  abort           = notifyCheckpointAborted -> abort
No Airflow and no Spark here: the operators and the Spark job call these methods.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError, FencedError, SinkError, TransactionLostError
from airflow_exactly_once.core.faults import fault_point
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.planner import plan_ranges
from airflow_exactly_once.core.sink import Handles, Sink
from airflow_exactly_once.core.source import OffsetSource
from airflow_exactly_once.core.startup import startup_positions
from airflow_exactly_once.core.states import BatchState

log = logging.getLogger(__name__)

MAX_PLAN_ATTEMPTS = 5


@dataclass(frozen=True)
class PlanOutcome:
    """What `plan` decided. `needs_commit` says whether the later steps have work.

    `batch` is the batch the decision is about (an EMPTY one for "empty", the committed one
    for "already-committed"), or None when the run was superseded.
    """

    action: str  # planned | replay | replanned | already-committed | superseded | empty
    batch: Batch | None
    message: str

    @property
    def needs_commit(self) -> bool:
        return self.batch is not None and self.batch.state in (BatchState.PLANNED, BatchState.PREPARED)


class BatchCoordinator:
    def __init__(self, config: PipelineConfig, ledger: Ledger, sink: Sink,
                 source_factory: Callable[[], OffsetSource] | None = None) -> None:
        self.config = config
        self.ledger = ledger
        self.sink = sink.bind(config)
        self.source_factory = source_factory
        self.recovered: list[BatchId] = []  # batches this coordinator committed by recovery

    @property
    def pipeline_id(self) -> str:
        return self.config.pipeline_id

    # -- plan ----------------------------------------------------------------------

    def plan(self, run_id: str, interval: tuple[int, int] | None = None) -> PlanOutcome:
        """Fix this run's batch. `interval` ([start, end) epoch ms) is the run's data interval (interval mode)."""
        if self.config.range_mode == "interval":
            from airflow_exactly_once.core.intervals import IntervalPlanner

            return IntervalPlanner(self).plan(run_id, interval)
        self.ledger.ensure_pipeline(self.pipeline_id, self.config.fingerprint(), self.config.to_dict())
        if self.ledger.count_batches(self.pipeline_id, with_interval=True):
            raise ConfigurationError(f"pipeline {self.pipeline_id} has batches planned by data interval; it cannot "
                                     "switch to range_mode='continuation': give the new pipeline its own pipeline_id")
        own = self.ledger.latest_batch_for_run(self.pipeline_id, run_id)
        if own is not None and own.state in (BatchState.PLANNED, BatchState.PREPARED):
            return PlanOutcome("replay", own, f"run {run_id} already planned {own.describe()}; reusing it")
        if own is not None and own.state in (BatchState.COMMITTED, BatchState.EMPTY, BatchState.RETRACTED):
            done = {BatchState.COMMITTED: "already committed", BatchState.EMPTY: "already found nothing new in",
                    BatchState.RETRACTED: "committed and a rewind later retracted"}[own.state]
            message = f"run {run_id} {done} {own.describe()}; nothing to do (a re-run never takes newer data)"
            self.ledger.record_event(self.pipeline_id, own.seq, "replay-noop", message)
            return PlanOutcome("already-committed", own, message)

        self.sink.check(self.pipeline_id)
        self.recover()
        if own is not None:  # this run's batch was aborted: replay exactly its range, or nothing
            return self._replan(own, run_id)
        for _ in range(MAX_PLAN_ATTEMPTS):
            try:
                return self._plan_new(run_id)
            except FencedError as exc:
                if not exc.retriable:
                    raise
                log.info("planning raced with another run (%s); planning again", exc)
                self.recover()
        raise FencedError(f"could not plan pipeline {self.pipeline_id}: it kept being taken over by other runs",
                          retriable=True)

    def _plan_new(self, run_id: str) -> PlanOutcome:
        epoch = self._epoch()
        in_flight = self.ledger.list_batches(self.pipeline_id, [BatchState.PLANNED, BatchState.PREPARED])
        if any(b.state is BatchState.PREPARED for b in in_flight):
            raise FencedError("a batch became PREPARED while planning", retriable=True)
        positions = self.ledger.committed_positions(self.pipeline_id)
        source = self._source()
        try:
            tps = source.partitions(self.config.topics)
            log_starts, ends = source.log_start_offsets(tps), source.end_offsets(tps)
            starts = startup_positions(self.config, source, [tp for tp in tps if tp not in positions],
                                       log_starts, ends, first_run=not positions)
            plan = plan_ranges(self.config, positions, tps, log_starts, ends, starts)
        finally:
            source.close()
        self.ledger.register_partitions(self.pipeline_id, plan.new_partitions)
        for (topic, partition), (offset, origin) in sorted(plan.new_partitions.items()):
            log.info("plan: %s[%d] is new to the ledger; it starts at offset %d (%s)", topic, partition, offset, origin)
        for note in plan.skipped:
            log.warning("data loss accepted by data_loss_policy='skip': %s", note)
            self.ledger.record_event(self.pipeline_id, None, "data-loss-skipped", note)
        details = {"skipped": plan.skipped} if plan.skipped else None
        if plan.is_empty:  # recorded, so the ledger shows the run; it takes nothing over
            batch = self.ledger.create_batch(self.pipeline_id, run_id, plan.ranges, expected_epoch=epoch,
                                             details=details, state=BatchState.EMPTY, resets=plan.resets)
            return PlanOutcome("empty", batch, f"no new committed records in {', '.join(self.config.topics)}: "
                               f"recorded {batch.describe()}; nothing to write")
        batch = self.ledger.create_batch(
            self.pipeline_id, run_id, plan.ranges, expected_epoch=epoch,
            supersede=[b.seq for b in in_flight], details=details, resets=plan.resets)
        fault_point("plan.after_ledger")
        return PlanOutcome("planned", batch, f"planned {batch.describe()}")

    def _replan(self, aborted: Batch, run_id: str) -> PlanOutcome:
        later = [b for b in self.ledger.list_batches(self.pipeline_id, [BatchState.COMMITTED], limit=1)
                 if b.seq > aborted.seq]
        if later:
            message = (f"run {run_id}'s batch {aborted.seq} was aborted and its range was processed again by "
                       f"batch {later[0].seq}; this run writes nothing (it never takes newer data)")
            self.ledger.record_event(self.pipeline_id, aborted.seq, "replay-noop", message)
            return PlanOutcome("superseded", None, message)
        positions = self.ledger.committed_positions(self.pipeline_id)
        moved = [r for r in aborted.ranges if r.size and positions.get((r.topic, r.partition)) != r.start]
        if moved:  # a rewind or accepted data loss moved the position since: replaying would leave a gap
            r = moved[0]
            message = (f"run {run_id}'s batch {aborted.seq} was aborted, and {r.topic}[{r.partition}] has moved from "
                       f"{r.start} to {positions.get((r.topic, r.partition))} since (see the events); this run "
                       "writes nothing, the next runs continue from there")
            self.ledger.record_event(self.pipeline_id, aborted.seq, "replay-noop", message)
            return PlanOutcome("superseded", None, message)
        in_flight = self.ledger.list_batches(self.pipeline_id, [BatchState.PLANNED])
        batch = self.ledger.create_batch(self.pipeline_id, run_id, aborted.ranges, expected_epoch=self._epoch(),
                                         supersede=[b.seq for b in in_flight],
                                         details={"replays": aborted.seq})
        return PlanOutcome("replanned", batch, f"replaying the range of aborted batch {aborted.seq}: {batch.describe()}")

    def _epoch(self) -> int:
        pipeline = self.ledger.pipeline(self.pipeline_id)
        return 0 if pipeline is None else pipeline["epoch"]

    def _source(self) -> OffsetSource:
        if self.source_factory is None:
            raise RuntimeError("this coordinator was built without an offset source")
        return self.source_factory()

    def recover(self, batches: list[Batch] | None = None) -> list[str]:
        """Commit (or find lost) every PREPARED batch before anything new is planned.

        Also finishes retractions a rewind recorded but could not complete, so that no
        new batch rewrites a range whose old output is still visible.
        """
        from airflow_exactly_once.core.rewind import finish_retractions

        results = finish_retractions(self.ledger, self.sink, self.pipeline_id)
        if batches is None:
            batches = self.ledger.list_batches(self.pipeline_id, [BatchState.PREPARED], newest_first=False)
        for batch in batches:
            log.info("recovery: %s was left PREPARED by run %s; committing it", batch.describe(), batch.run_id)
            try:
                results.append(self.commit(batch.id))
                self.recovered.append(batch.id)
            except TransactionLostError as exc:
                log.warning("recovery: %s", exc)
                results.append(f"batch {batch.seq} lost and aborted")
        return results

    # -- write (the Spark job drives these two) ------------------------------------

    def begin_write(self, batch_id: BatchId) -> Batch | None:
        """Claim the batch for this attempt; None when it is already past the write."""
        batch = self.ledger.get_batch(batch_id)
        if batch.state in (BatchState.PREPARED, BatchState.COMMITTED):
            return None
        if batch.state is BatchState.ABORTED:
            raise FencedError(f"batch {batch_id} was aborted ({batch.error}); this run cannot write it")
        claimed = self.ledger.claim(batch_id)
        fault_point("write.before_stage")
        return claimed

    def finish_write(self, batch: Batch, handles: Handles, input_records: int | None,
                     output_records: int | None) -> Batch:
        fault_point("write.after_stage")
        try:
            prepared = self.ledger.mark_prepared(batch.id, batch.epoch, handles, input_records, output_records)
        except FencedError:
            log.warning("this write attempt was fenced; discarding its staged output")
            self.sink.abort(batch, handles)
            raise
        fault_point("write.after_prepare")
        return prepared

    # -- notify_complete / abort ---------------------------------------------------

    def commit(self, batch_id: BatchId) -> str:
        """Commit the sink, then (only then) advance the offsets. Safe to run again."""
        batch = self.ledger.get_batch(batch_id)
        if batch.state is BatchState.COMMITTED:
            return f"batch {batch_id} was already committed"
        if batch.state is BatchState.ABORTED:
            raise SinkError(f"batch {batch_id} was aborted ({batch.error}); its range is processed again by "
                            "the next run")
        if batch.state is BatchState.PLANNED:
            raise SinkError(f"batch {batch_id} is still PLANNED: its write did not finish, so there is nothing "
                            "to commit (run the write task first)")
        fault_point("notify.before_sink_commit")
        replaced = self._replaced_batch(batch)
        try:
            if replaced is None:
                outcome = self.sink.commit(batch, batch.handles or {})
            else:
                outcome = self.sink.commit_replacing(batch, batch.handles or {}, replaced)
        except TransactionLostError as exc:
            self.ledger.mark_aborted(batch_id, f"sink output lost: {exc}", from_state=BatchState.PREPARED)
            raise TransactionLostError(
                f"{exc}. Batch {batch_id} is now ABORTED and its range will be processed again by the next run."
            ) from exc
        fault_point("notify.after_sink_commit")
        changed = self.ledger.mark_committed(batch_id, retracts=[replaced.seq] if replaced is not None else [])
        fault_point("notify.after_ledger")
        return f"{outcome}; batch {batch_id} {'COMMITTED' if changed else 'was already COMMITTED'}"

    def _replaced_batch(self, batch: Batch) -> Batch | None:
        """The committed batch whose output this one replaces (a re-run of a data interval)."""
        seq = batch.details.get("replaces")
        if seq is None:
            return None
        old = self.ledger.get_batch(BatchId(self.pipeline_id, int(seq)))
        # RETRACTED: an earlier attempt of this commit already swapped the output.
        return old if old.state in (BatchState.COMMITTED, BatchState.RETRACTED) else None

    def abort(self, batch_id: BatchId, reason: str) -> str:
        batch = self.ledger.get_batch(batch_id)
        if batch.state is BatchState.COMMITTED:
            return f"batch {batch_id} is COMMITTED; nothing to abort"
        if batch.state is BatchState.PREPARED:
            return (f"batch {batch_id} is PREPARED: its output is pre-committed and will be committed by "
                    "notify_complete or by the next run's recovery, so it is not aborted")
        try:
            self.ledger.mark_aborted(batch_id, reason)
        except FencedError:
            current = self.ledger.get_batch(batch_id)
            if current.state is BatchState.PREPARED:
                return f"batch {batch_id} became PREPARED meanwhile; left for commit"
            raise
        self.sink.abort(batch, None)
        return f"batch {batch_id} ABORTED and its staged output removed; the next run processes its range again"
