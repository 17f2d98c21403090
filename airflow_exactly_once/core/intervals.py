"""Interval mode: each run reads the records of its Airflow data interval, by record timestamp.

A boundary in time, `t`, falls at the first offset whose record timestamp is >= t
(Kafka's offsets-for-times). Each boundary is fixed in the ledger the first time a batch
needs it and shared by both intervals it separates, so the intervals tile every partition
whatever order, or overlap, their runs come in. A record that arrives after its
interval's end boundary was fixed belongs to the next interval: exactly once, never lost.

What changes compared with continuation mode:
  * the range depends only on the interval, never on the committed position, so runs of
    different intervals are independent and may run in parallel;
  * recovery first and fencing apply per interval: a PREPARED batch of the same interval
    is committed before planning, a PLANNED batch of another run of the same interval is
    superseded; batches of other intervals belong to their own runs and are left alone;
  * re-running a processed interval is a recorded no-op (interval_rerun="noop") or plans
    the same range again and swaps its output for the old one (interval_rerun="replace").
"""

from __future__ import annotations

import logging

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import (
    ConfigurationError,
    DataLossError,
    FencedError,
    IntervalNotOverError,
)
from airflow_exactly_once.core.faults import fault_point
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.protocol import MAX_PLAN_ATTEMPTS, BatchCoordinator, PlanOutcome
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.timestamps import iso, now_ms

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
Interval = tuple[int, int]


def label(interval: Interval) -> str:
    return f"[{iso(interval[0])}, {iso(interval[1])})"


class IntervalPlanner:
    """The plan step of a pipeline with range_mode="interval"; the other steps are unchanged."""

    def __init__(self, coordinator: BatchCoordinator) -> None:
        self.coordinator = coordinator
        self.ledger = coordinator.ledger
        self.config = coordinator.config

    @property
    def pipeline_id(self) -> str:
        return self.config.pipeline_id

    def plan(self, run_id: str, interval: Interval | None) -> PlanOutcome:
        interval = self._check(run_id, interval)
        self.ledger.ensure_pipeline(self.pipeline_id, self.config.fingerprint(), self.config.to_dict())
        if self.ledger.count_batches(self.pipeline_id, with_interval=False):
            raise ConfigurationError(f"pipeline {self.pipeline_id} has batches planned in continuation mode; it cannot "
                                     "switch to range_mode='interval': give the new pipeline its own pipeline_id")
        if self.config.interval_rerun == "replace" and not self.coordinator.sink.supports_retract:
            raise ConfigurationError(f"interval_rerun='replace' needs a sink that can withdraw committed output, and "
                                     f"the {self.config.sink.get('type')} sink cannot; use interval_rerun='noop'")
        self.coordinator.sink.check(self.pipeline_id)
        for _ in range(MAX_PLAN_ATTEMPTS):
            try:
                return self._plan(run_id, interval)
            except FencedError as exc:
                if not exc.retriable:
                    raise
                log.info("planning interval %s raced with another run (%s); planning again", label(interval), exc)
        raise FencedError(f"could not plan interval {label(interval)} of {self.pipeline_id}: other runs kept taking "
                          "the pipeline over", retriable=True)

    def _check(self, run_id: str, interval: Interval | None) -> Interval:
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

    def _plan(self, run_id: str, interval: Interval) -> PlanOutcome:
        epoch = self.coordinator._epoch()
        batches = self.ledger.interval_batches(self.pipeline_id, interval)
        for batch in batches:
            if batch.run_id == run_id and batch.state in (BatchState.PLANNED, BatchState.PREPARED):
                return PlanOutcome("replay", batch, f"run {run_id} already planned {batch.describe()}; reusing it")
        prepared = sorted((b for b in batches if b.state is BatchState.PREPARED), key=lambda b: b.seq)
        if prepared:  # recovery first, for this interval: another run's pre-committed output
            self.coordinator.recover(prepared)
            epoch = self.coordinator._epoch()
            batches = self.ledger.interval_batches(self.pipeline_id, interval)
        done = next((b for b in batches if b.state in (BatchState.COMMITTED, BatchState.EMPTY)), None)
        if done is not None and self.config.interval_rerun == "noop":
            message = (f"interval {label(interval)} was already processed by {done.describe()} (run {done.run_id}); "
                       "interval_rerun='noop': nothing to do")
            self.ledger.record_event(self.pipeline_id, done.seq, "interval-rerun-noop", f"run {run_id}: {message}")
            return PlanOutcome("already-committed", done, message)
        ranges, skipped = self._ranges(interval)
        for note in skipped:
            log.warning("data loss accepted by data_loss_policy='skip': %s", note)
            self.ledger.record_event(self.pipeline_id, None, "data-loss-skipped", note)
        details: dict = {"interval": list(interval)}
        replaces = done.seq if done is not None and done.state is BatchState.COMMITTED else None
        if replaces is not None:
            details["replaces"] = replaces
        if skipped:
            details["skipped"] = skipped
        empty = all(r.size == 0 for r in ranges)
        batch = self.ledger.create_batch(
            self.pipeline_id, run_id, ranges, expected_epoch=epoch, details=details, interval=interval,
            supersede=[b.seq for b in batches if b.state is BatchState.PLANNED],
            state=BatchState.EMPTY if empty else BatchState.PLANNED)
        if empty:
            return PlanOutcome("empty", batch, f"no records in interval {label(interval)}: recorded {batch.describe()}; "
                               "nothing to write")
        fault_point("plan.after_ledger")
        what = f"interval {label(interval)}" + (f", replacing batch {replaces}" if replaces is not None else "")
        return PlanOutcome("planned", batch, f"planned {what}: {batch.describe()}")

    def _ranges(self, interval: Interval) -> tuple[list[OffsetRange], list[str]]:
        source = self.coordinator._source()
        try:
            tps = source.partitions(self.config.topics)
            log_starts, ends = source.log_start_offsets(tps), source.end_offsets(tps)
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


def interval_ranges(config: PipelineConfig, tps: list[TopicPartition], fixed: dict[tuple[TopicPartition, int], int],
                    interval: Interval, log_starts: dict[TopicPartition, int],
                    ends: dict[TopicPartition, int]) -> tuple[list[OffsetRange], list[str]]:
    """The ranges between the interval's fixed boundaries, after the data-loss policy."""
    ranges, skipped = [], []
    for tp in sorted(tps):
        topic, partition = tp
        lo, hi = fixed[(tp, interval[0])], fixed[(tp, interval[1])]
        problem = None
        if hi > ends[tp]:
            problem = (f"the interval ends at offset {hi} of {topic}[{partition}], beyond the end of the log "
                       f"({ends[tp]}): the topic was probably deleted and recreated")
            lo, hi = min(lo, ends[tp]), ends[tp]
        if lo < log_starts[tp]:
            problem = (f"offsets {lo}..{min(hi, log_starts[tp]) - 1} of {topic}[{partition}] in this interval are no "
                       f"longer in the topic (log start is {log_starts[tp]}: retention or deletion)")
            lo = min(log_starts[tp], hi)
        if problem is not None:
            if config.data_loss_policy != "skip":
                raise DataLossError(f"Data loss in interval {label(interval)}: {problem}. Nothing was planned and the "
                                    "ledger is unchanged. Set data_loss_policy='skip' to process what is left and "
                                    "record the loss.")
            skipped.append(f"skipped in interval {label(interval)}: {problem}")
        ranges.append(OffsetRange(topic, partition, lo, hi))
    return ranges, skipped
