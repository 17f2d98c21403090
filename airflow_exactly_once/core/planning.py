"""The plan step: recovery first, then this run's offset range, in one of two strategies.

Both strategies share the frame (Flink's initializeState + open): the pipeline row, the
guard against switching range modes, the sink's plan-time check, and planning again when
another run took the pipeline over meanwhile (a retriable FencedError from the ledger's
compare-and-set). What differs is how a range is fixed:

* `ContinuationPlanner`: each run continues where the last committed batch ended; a run
  that planned before replays exactly its range (or nothing), never newer data;
* `IntervalPlanner`: each run reads the records of its Airflow data interval, between
  boundary offsets fixed in the ledger the first time an interval needs them, so runs of
  different intervals are independent and tile every partition in any order. Recovery
  first and fencing apply per interval; re-running a processed interval is a recorded
  no-op (interval_rerun="noop") or replaces its output (interval_rerun="replace").
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Callable, ClassVar, Mapping

from airflow_exactly_once.core.errors import ConfigurationError, FencedError, IntervalNotOverError
from airflow_exactly_once.core.faults import fault_point
from airflow_exactly_once.core.model import REPLACES, SKIPPED, Batch
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.ranges import Interval, continuation_ranges, interval_ranges, label
from airflow_exactly_once.core.source import OffsetSource
from airflow_exactly_once.core.startup import startup_positions
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.timestamps import iso, now_ms, to_epoch_ms
from airflow_exactly_once.core.topics import partitions_to_read, topics_of

log = logging.getLogger(__name__)

MAX_PLAN_ATTEMPTS = 5
TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class PlanOutcome:
    """What `plan` decided. `needs_commit` says whether the later steps have work.

    `batch` is the batch the decision is about (an EMPTY one for "empty", the committed one
    for "already-committed"), or None when the run was superseded.
    """

    action: str  # planned | replay | replanned | already-committed | superseded | empty
    batch: Batch | None
    message: str
    # What this plan read from Kafka: the last stable offset per partition (empty when it read nothing,
    # e.g. a replay), so that the lag behind the planned batch is known without asking Kafka again.
    last_stable: Mapping[TopicPartition, int] = field(default_factory=dict)
    # PLANNED batches of other runs that this plan aborted by taking the pipeline (or interval) over.
    superseded: tuple[int, ...] = ()

    @property
    def needs_commit(self) -> bool:
        return self.batch is not None and self.batch.state in (BatchState.PLANNED, BatchState.PREPARED)

    @property
    def lag(self) -> dict[TopicPartition, int]:
        """Committed records in Kafka past the end of this plan's batch, per partition (an upper bound:
        transaction markers take offsets too); {} when the plan read no offsets."""
        if self.batch is None or not self.last_stable:
            return {}
        return {(r.topic, r.partition): max(0, self.last_stable[(r.topic, r.partition)] - r.end)
                for r in self.batch.ranges if (r.topic, r.partition) in self.last_stable}


class Planner(ABC):
    """The frame both strategies share."""

    range_mode: ClassVar[str]

    def __init__(self, coordinator: BatchCoordinator, source_factory: Callable[[], OffsetSource]) -> None:
        self.coordinator = coordinator
        self.ledger = coordinator.ledger
        self.config = coordinator.config
        self.source_factory = source_factory
        self.cleared_run_after: int | None = None  # set by plan()
        # What the current planning attempt read and took over (PlanOutcome.last_stable, .superseded).
        self.last_stable: dict[TopicPartition, int] = {}
        self.superseded: tuple[int, ...] = ()
        # The pipeline's epoch as plan() read it first (ensure_pipeline), for the first attempt's _epoch(): see there.
        self._first_epoch: int | None = None

    @property
    def pipeline_id(self) -> str:
        return self.config.pipeline_id

    def plan(self, run_id: str, interval: Interval | None = None, cleared_run_after: int | None = None) -> PlanOutcome:
        """Fix this run's batch (or find it fixed before). `interval` is the run's data interval, epoch ms;
        `cleared_run_after`: when a run that was cleared became due (epoch ms), None for a run never cleared."""
        interval = self._check_run(run_id, interval)
        self.cleared_run_after = cleared_run_after
        epoch = self.ledger.ensure_pipeline(self.pipeline_id, self.config.fingerprint(), self.config.to_stored_dict())
        mode = self.ledger.newest_batch_mode(self.pipeline_id)
        if mode is not None and mode != self.range_mode:
            raise ConfigurationError(f"pipeline {self.pipeline_id} has batches planned in {mode} mode; it cannot "
                                     f"switch to range_mode={self.range_mode!r}: give the new pipeline its own "
                                     "pipeline_id")
        settled = self._settled(run_id, interval)
        if settled is not None:
            return settled
        self._check_sink()
        for attempt in range(MAX_PLAN_ATTEMPTS):
            self.last_stable, self.superseded = {}, ()
            self._first_epoch = epoch if attempt == 0 else None
            try:
                outcome = self._plan_once(run_id, interval)
            except FencedError as exc:
                if not exc.retriable:
                    raise
                log.info("planning raced with another run (%s); planning again", exc)
                continue
            if self.superseded:
                self._release_superseded()
            return replace(outcome, last_stable=dict(self.last_stable), superseded=self.superseded)
        raise FencedError(f"could not plan pipeline {self.pipeline_id}: other runs kept taking it over",
                          retriable=True)

    def _release_superseded(self) -> None:
        """Batches this plan took over from other runs may have staged output, or an attempt still running."""
        try:
            for outcome in self.coordinator.release_aborted():
                log.info("plan: %s", outcome)
        except Exception as exc:  # the batch is planned; the next run's recovery releases them
            log.warning("plan: could not release the batches this run took over (%s); the next run's recovery "
                        "does", exc)

    def _check_run(self, run_id: str, interval: Interval | None) -> Interval | None:
        return interval

    def _check_sink(self) -> None:
        fault_point("plan.before_check")
        self.coordinator.sink.check(self.pipeline_id)

    @abstractmethod
    def _settled(self, run_id: str, interval: Interval | None) -> PlanOutcome | None:
        """The outcome when this run's batch needs no planning (it planned or finished before), else None."""

    @abstractmethod
    def _plan_once(self, run_id: str, interval: Interval | None) -> PlanOutcome:
        """Recover, then fix a range; raises a retriable FencedError when another run interfered."""

    def _epoch(self) -> int:
        """The pipeline's epoch, read before the batches that the plan decides on: the compare-and-set of
        create_batch expects it, so whatever changed them after this read makes the plan fail and plan again.

        The first call of a plan's first attempt takes the epoch ensure_pipeline read, without asking again: that
        read came before every read of the plan (its own batch in _settled too), so it fences all of them.
        """
        if self._first_epoch is not None:
            epoch, self._first_epoch = self._first_epoch, None
            return epoch
        pipeline = self.ledger.pipeline(self.pipeline_id)
        return 0 if pipeline is None else pipeline["epoch"]

    def _record_skipped(self, skipped: list[str]) -> None:
        for note in skipped:
            log.warning("data loss accepted by data_loss_policy='skip': %s", note)
            self.ledger.record_event(self.pipeline_id, None, "data-loss-skipped", note)


class ContinuationPlanner(Planner):
    range_mode = "continuation"

    def __init__(self, coordinator: BatchCoordinator, source_factory: Callable[[], OffsetSource]) -> None:
        super().__init__(coordinator, source_factory)
        # The run's own batch as _settled found it (None or ABORTED, the two it leaves to planning), for the first
        # attempt: [] when there is none to pass on.
        self._first_own: list[Batch | None] = []

    def _settled(self, run_id: str, interval: Interval | None) -> PlanOutcome | None:
        own = self.ledger.latest_batch_for_run(self.pipeline_id, run_id)
        self._first_own = [own]
        if own is not None and own.state in (BatchState.PLANNED, BatchState.PREPARED):
            return PlanOutcome("replay", own, f"run {run_id} already planned {own.describe()}; reusing it")
        if own is not None and own.state in (BatchState.COMMITTED, BatchState.EMPTY, BatchState.RETRACTED):
            done = {BatchState.COMMITTED: "already committed", BatchState.EMPTY: "already found nothing new in",
                    BatchState.RETRACTED: "committed and a rewind later retracted"}[own.state]
            message = f"run {run_id} {done} {own.describe()}; nothing to do (a re-run never takes newer data)"
            self.ledger.record_event(self.pipeline_id, own.seq, "replay-noop", message)
            return PlanOutcome("already-committed", own, message)
        if own is None:
            self._refuse_pruned_run(run_id)
        return None

    def _refuse_pruned_run(self, run_id: str) -> None:
        """A cleared run due before the newest batch retention pruned: its own batch, if it had one, is gone.

        Planning a new batch for it would take newer data (a re-run never does), so it fails instead. A run
        never cleared, or due after that batch was planned, cannot have had a pruned batch.
        """
        if self.cleared_run_after is None:
            return
        floor = self.ledger.retention_floor(self.pipeline_id)
        if floor.batch_created_at is None or self.cleared_run_after > to_epoch_ms(floor.batch_created_at):
            return
        raise ConfigurationError(
            f"run {run_id} was cleared, and it was due ({iso(self.cleared_run_after)}) before batch {floor.batch_seq} "
            f"of pipeline {self.pipeline_id} was planned ({iso(to_epoch_ms(floor.batch_created_at))}), the newest "
            f"batch retention has pruned (retention_batches={self.config.retention_batches}, retention_days="
            f"{self.config.retention_days}): whatever this run committed is no longer in the ledger, and a re-run "
            "never takes newer data. Trigger a new run to process what waits; to keep runs re-runnable for longer, "
            "raise retention_batches or retention_days")

    def _plan_once(self, run_id: str, interval: Interval | None) -> PlanOutcome:
        # The epoch first, before any batch is read (see _epoch). Recovery changes no epoch, so reading it before
        # recovery costs no extra attempt; the first attempt takes ensure_pipeline's.
        first_attempt = self._first_epoch is not None
        epoch = self._epoch()
        work = self.ledger.open_work(self.pipeline_id)
        self.coordinator.recover(work=work)
        if first_attempt and self._first_own:
            # As _settled read it, after the epoch: recovery leaves a run's own batch as it was (_settled returns
            # for PLANNED and PREPARED, ABORTED is final), and a batch of this run created since bumped the epoch.
            own = self._first_own[0]
        else:
            own = self.ledger.latest_batch_for_run(self.pipeline_id, run_id)
        self._first_own = []
        if own is not None and own.state is BatchState.ABORTED:  # replay exactly its range, or nothing
            return self._replan(own, run_id, epoch)
        # The batches in flight as open_work read them (after the epoch), unless recovery committed or aborted some.
        in_flight = (self.ledger.list_batches(self.pipeline_id, [BatchState.PLANNED, BatchState.PREPARED])
                     if work.prepared else work.in_flight)
        if any(b.state is BatchState.PREPARED for b in in_flight):
            raise FencedError("a batch became PREPARED while planning", retriable=True)
        positions = self.ledger.committed_positions(self.pipeline_id)
        source = self.source_factory()
        try:
            tps = partitions_to_read(source, self.config.topics, self.config.topic_pattern,
                                     self.config.bootstrap_servers or "the Kafka cluster")
            log_starts, ends = source.log_start_offsets(tps), source.end_offsets(tps)
            self.last_stable = dict(ends)
            starts = startup_positions(self.config, source, [tp for tp in tps if tp not in positions],
                                       log_starts, ends, first_run=not positions, known_topics=topics_of(positions))
        finally:
            source.close()
        plan = continuation_ranges(self.config, positions, tps, log_starts, ends, starts)
        self.ledger.register_partitions(self.pipeline_id, plan.new_partitions)
        for (topic, partition), (offset, origin) in sorted(plan.new_partitions.items()):
            log.info("plan: %s[%d] is new to the ledger; it starts at offset %d (%s)", topic, partition, offset, origin)
        self._record_skipped(plan.skipped)
        details = {SKIPPED: plan.skipped} if plan.skipped else None
        if plan.is_empty:  # recorded, so the ledger shows the run; it takes nothing over
            batch = self.ledger.create_batch(self.pipeline_id, run_id, plan.ranges, expected_epoch=epoch,
                                             details=details, state=BatchState.EMPTY, resets=plan.resets)
            return PlanOutcome("empty", batch, f"no new committed records in {self.config.reads()}: "
                               f"recorded {batch.describe()}; nothing to write")
        self.superseded = tuple(b.seq for b in in_flight)
        batch = self.ledger.create_batch(
            self.pipeline_id, run_id, plan.ranges, expected_epoch=epoch,
            supersede=self.superseded, details=details, resets=plan.resets)
        fault_point("plan.after_ledger")
        return PlanOutcome("planned", batch, f"planned {batch.describe()}")

    def _replan(self, aborted: Batch, run_id: str, epoch: int) -> PlanOutcome:
        """Plan the range of the run's ABORTED batch again, unless it is no longer where the positions stand.
        `epoch` was read before the batches (see _epoch)."""
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
        self.superseded = tuple(b.seq for b in in_flight)
        batch = self.ledger.create_batch(self.pipeline_id, run_id, aborted.ranges, expected_epoch=epoch,
                                         supersede=self.superseded,
                                         details={"replays": aborted.seq})
        return PlanOutcome("replanned", batch, f"replaying the range of aborted batch {aborted.seq}: {batch.describe()}")


class IntervalPlanner(Planner):
    range_mode = "interval"

    def _check_run(self, run_id: str, interval: Interval | None) -> Interval:
        if interval is None or interval[1] <= interval[0]:
            shown = "none" if interval is None else label(interval)
            raise ConfigurationError(
                f"range_mode='interval' reads the run's data interval, and run {run_id} has an empty one ({shown}). "
                "Give the DAG a schedule with data intervals: CronDataIntervalTimetable('@hourly', timezone='UTC'), "
                "DeltaDataIntervalTimetable(timedelta(hours=1)) or CronTriggerTimetable(..., "
                "interval=timedelta(hours=1)) (in Airflow 3 a plain cron string or timedelta triggers at points in "
                "time, with empty intervals). Or use range_mode='continuation'.")
        if interval[1] > now_ms():
            raise IntervalNotOverError(f"the data interval {label(interval)} of run {run_id} has not ended yet, so "
                                       "its records are not all in Kafka; the run is retried later")
        return int(interval[0]), int(interval[1])

    def _check_sink(self) -> None:
        if self.config.interval_rerun == "replace" and not self.coordinator.sink.supports_retract:
            raise ConfigurationError(f"interval_rerun='replace' needs a sink that can withdraw committed output, and "
                                     f"the {self.coordinator.sink.name} sink cannot; use interval_rerun='noop'")
        super()._check_sink()

    def _settled(self, run_id: str, interval: Interval | None) -> PlanOutcome | None:
        return None  # decided per interval, after recovery (_plan_once)

    def _plan_once(self, run_id: str, interval: Interval | None) -> PlanOutcome:
        assert interval is not None
        # The epoch is read before the batches: if another run changes them after this read, the
        # compare-and-set of create_batch fails and this run plans again.
        epoch = self._epoch()
        batches = self.ledger.interval_batches(self.pipeline_id, interval)
        for batch in batches:
            if batch.run_id == run_id and batch.state in (BatchState.PLANNED, BatchState.PREPARED):
                return PlanOutcome("replay", batch, f"run {run_id} already planned {batch.describe()}; reusing it")
        prepared = sorted((b for b in batches if b.state is BatchState.PREPARED), key=lambda b: b.seq)
        if prepared:  # recovery first, for this interval: another run's pre-committed output
            self.coordinator.recover(prepared)
            epoch = self._epoch()
            batches = self.ledger.interval_batches(self.pipeline_id, interval)
        done = next((b for b in batches if b.state in (BatchState.COMMITTED, BatchState.EMPTY)), None)
        if done is None:
            self._refuse_pruned(interval)
        if done is not None and self.config.interval_rerun == "noop":
            message = (f"interval {label(interval)} was already processed by {done.describe()} (run {done.run_id}); "
                       "interval_rerun='noop': nothing to do")
            self.ledger.record_event(self.pipeline_id, done.seq, "interval-rerun-noop", f"run {run_id}: {message}")
            return PlanOutcome("already-committed", done, message)
        ranges, skipped = self._ranges(interval)
        self._record_skipped(skipped)
        details: dict = {"interval": list(interval)}
        replaces = done.seq if done is not None and done.state is BatchState.COMMITTED else None
        if replaces is not None:
            details[REPLACES] = replaces
        if skipped:
            details[SKIPPED] = skipped
        empty = all(r.size == 0 for r in ranges)
        self.superseded = tuple(b.seq for b in batches if b.state is BatchState.PLANNED)
        batch = self.ledger.create_batch(
            self.pipeline_id, run_id, ranges, expected_epoch=epoch, details=details, interval=interval,
            supersede=self.superseded,
            state=BatchState.EMPTY if empty else BatchState.PLANNED)
        if empty:
            return PlanOutcome("empty", batch, f"no records in interval {label(interval)}: recorded {batch.describe()}; "
                               "nothing to write")
        fault_point("plan.after_ledger")
        what = f"interval {label(interval)}" + (f", replacing batch {replaces}" if replaces is not None else "")
        return PlanOutcome("planned", batch, f"planned {what}: {batch.describe()}")

    def _refuse_pruned(self, interval: Interval) -> None:
        """An interval before retention's floor, with no batch left: whether it ran is no longer known."""
        floor = self.ledger.retention_floor(self.pipeline_id)
        if floor.interval_end is None or interval[0] >= floor.interval_end:
            return
        raise ConfigurationError(
            f"interval {label(interval)} starts before {iso(floor.interval_end)}, the end of the intervals whose "
            f"batches retention pruned from pipeline {self.pipeline_id} (batches up to {floor.batch_seq}; "
            f"retention_batches={self.config.retention_batches}, retention_days={self.config.retention_days}): "
            "whether it was processed is no longer known, so it is not run again (that could duplicate its output). "
            "Re-run old intervals while they are within retention (raise retention_batches / retention_days), or "
            "backfill them under a new pipeline_id")

    def _ranges(self, interval: Interval):
        source = self.source_factory()
        try:
            tps = source.partitions(self.config.topics)
            log_starts, ends = source.log_start_offsets(tps), source.end_offsets(tps)
            self.last_stable = dict(ends)
            wanted = {}
            for at in interval:
                for tp, offset in source.offsets_for_times(tps, at).items():
                    if offset is None or offset > ends[tp]:
                        wanted[(tp, at)] = (ends[tp], f"no record at or after {iso(at)} yet: end of the log")
                    else:
                        wanted[(tp, at)] = (offset, f"first record at or after {iso(at)}")
        finally:
            source.close()
        fixed = self.ledger.fix_boundaries(self.pipeline_id, wanted)
        for tp in sorted(tps):
            log.info("plan: %s[%d] interval %s is offsets %d..%d", tp[0], tp[1], label(interval),
                     fixed[(tp, interval[0])], fixed[(tp, interval[1])])
        return interval_ranges(self.config, tps, fixed, interval, log_starts, ends)


PLANNERS: dict[str, type[Planner]] = {p.range_mode: p for p in (ContinuationPlanner, IntervalPlanner)}


def plan_batch(coordinator: BatchCoordinator, source_factory: Callable[[], OffsetSource], run_id: str,
               interval: Interval | None = None, cleared_run_after: int | None = None) -> PlanOutcome:
    """The plan step of `coordinator`'s pipeline, with the planner of its range_mode (see Planner.plan)."""
    planner = PLANNERS[coordinator.config.range_mode](coordinator, source_factory)
    return planner.plan(run_id, interval, cleared_run_after)
