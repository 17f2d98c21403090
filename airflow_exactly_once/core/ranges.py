"""The offset range of a new batch, as pure functions of what the ledger and Kafka said.

Continuation mode continues each partition where its committed position is; interval mode
reads between the offsets fixed for its data interval's boundaries. Both apply the same
data-loss policy when the planned offsets are no longer in the topic (`lost_data`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError, DataLossError
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.startup import edge_start
from airflow_exactly_once.core.timestamps import iso
from airflow_exactly_once.core.topics import matching_topics, topics_of

TopicPartition = tuple[str, int]
Interval = tuple[int, int]


def start_of_waiting(tp: TopicPartition, positions: Mapping[TopicPartition, int],
                     log_start: Mapping[TopicPartition, int]) -> int:
    """The first offset a next batch would read: the ledger's position (from the log start if the
    ledger has none, or if the records there were deleted)."""
    start = log_start.get(tp, 0)
    return max(positions.get(tp, start), start)


def label(interval: Interval) -> str:
    return f"[{iso(interval[0])}, {iso(interval[1])})"


def lost_data(config: PipelineConfig, problem: str, skip_means: str) -> str:
    """data_loss_policy for one lost range: raise (fail), or return the note to record (skip)."""
    if config.data_loss_policy != "skip":
        raise DataLossError(f"{problem}. Nothing was planned and the ledger is unchanged. Set data_loss_policy='skip' "
                            f"to {skip_means} and record the loss, or restore the data.")
    return problem


@dataclass
class Plan:
    ranges: list[OffsetRange]
    # Partitions seen for the first time: where they start and why.
    new_partitions: dict[TopicPartition, tuple[int, str]] = field(default_factory=dict)
    # Data skipped under data_loss_policy="skip": one sentence per partition.
    skipped: list[str] = field(default_factory=list)
    # The same decisions as position resets for the ledger: where each partition continues, and why.
    resets: dict[TopicPartition, tuple[int, str]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return all(r.size == 0 for r in self.ranges)


def continuation_ranges(
    config: PipelineConfig,
    positions: dict[TopicPartition, int],
    partitions: list[TopicPartition],
    log_starts: dict[TopicPartition, int],
    ends: dict[TopicPartition, int],
    starts: dict[TopicPartition, tuple[int, str]] | None = None,
) -> Plan:
    """Ranges from the committed positions (or the startup mode) up to the stable end.

    `starts` holds start offsets resolved by core.startup for partitions without a
    position; without it, partitions start at the earliest or latest offset.
    """
    _check_topics_unchanged(config, positions)
    plan = Plan(ranges=[])
    first_run = not positions
    for tp in sorted(set(partitions)):
        log_start, end = log_starts[tp], ends[tp]
        if tp in positions:
            start = positions[tp]
        elif starts and tp in starts:
            start = starts[tp][0]
            plan.new_partitions[tp] = starts[tp]
        else:
            mode = config.startup_mode if first_run else config.new_partition_start
            start = edge_start(mode, log_start, end)
            origin = f"startup mode {mode}" if first_run else f"new partition, {mode}"
            plan.new_partitions[tp] = (start, origin)
        start = _continue_after_loss(config, tp, start, log_start, end, plan)
        stop = end if config.max_records_per_partition is None else min(end, start + int(config.max_records_per_partition))
        plan.ranges.append(OffsetRange(tp[0], tp[1], start, stop))
    for tp in sorted(set(positions) - set(partitions)):
        topic, partition = tp
        plan.skipped.append(lost_data(
            config, f"Data loss: partition {topic}[{partition}] had committed offset {positions[tp]} but no longer "
                    "exists (topic deleted, or recreated with fewer partitions)", "accept the loss"))
    return plan


def _check_topics_unchanged(config: PipelineConfig, positions: dict[TopicPartition, int]) -> None:
    """A pipeline id reused for other topics is a configuration change, not data loss: say so."""
    committed = topics_of(positions)
    if config.topic_pattern is not None:
        gone = [t for t in committed if not matching_topics(config.topic_pattern, [t])]
        now = f"the topics matching {config.topic_pattern!r}"
    else:
        gone = [t for t in committed if t not in config.topics]
        now = str(sorted(config.topics))
    if gone:
        raise ConfigurationError(
            f"pipeline {config.pipeline_id} has committed offsets of topic(s) {gone}, but its topics are now "
            f"{now} (before: {committed}): the same pipeline_id now reads other topics. Give the "
            "new flow its own pipeline_id (the ledger keeps the old one's history), or put the old topics back.")


def _continue_after_loss(config: PipelineConfig, tp: TopicPartition, start: int, log_start: int, end: int,
                         plan: Plan) -> int:
    topic, partition = tp
    if start < log_start:
        problem = (f"Data loss: offsets {start}..{log_start - 1} of {topic}[{partition}] are no longer in the topic "
                   f"(log start is {log_start}: retention or deletion passed the committed position)")
    elif start > end:
        problem = (f"Data loss: the committed offset {start} of {topic}[{partition}] is beyond the end of the log "
                   f"({end}): the topic was probably deleted and recreated")
    else:
        return start
    note = lost_data(config, problem, "continue from the log start")
    plan.skipped.append(f"skipped: {note}; continuing at {log_start}")
    plan.resets[tp] = (log_start, f"data loss skipped: {note}")
    return log_start


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
            note = lost_data(config, f"Data loss in interval {label(interval)}: {problem}", "process what is left")
            skipped.append(f"skipped: {note}")
        ranges.append(OffsetRange(topic, partition, lo, hi))
    return ranges, skipped
