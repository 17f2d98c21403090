"""Fixing the offset range of a new batch (Flink's `open` + `initializeState`, minus I/O).

Pure: it gets the committed positions from the ledger and the partition offsets from
the source and returns the ranges plus the decisions worth recording.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import DataLossError
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.startup import edge_start

TopicPartition = tuple[str, int]


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


def plan_ranges(
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
        start = _check_loss(config, tp, start, log_start, end, plan)
        stop = end if config.max_records_per_partition is None else min(end, start + int(config.max_records_per_partition))
        plan.ranges.append(OffsetRange(tp[0], tp[1], start, stop))
    for tp in sorted(set(positions) - set(partitions)):
        topic, partition = tp
        message = (f"partition {topic}[{partition}] had committed offset {positions[tp]} but no longer exists "
                   "(topic deleted or recreated with fewer partitions)")
        if config.data_loss_policy != "skip":
            raise DataLossError(f"{message}. Restore the topic, or set data_loss_policy='skip' to accept the loss.")
        plan.skipped.append(message)
    return plan


def _check_loss(config: PipelineConfig, tp: TopicPartition, start: int, log_start: int, end: int, plan: Plan) -> int:
    topic, partition = tp
    if start < log_start:
        problem = (f"offsets {start}..{log_start - 1} of {topic}[{partition}] are no longer in the topic "
                   f"(log start is {log_start}: retention or deletion passed the committed position)")
    elif start > end:
        problem = (f"the committed offset {start} of {topic}[{partition}] is beyond the end of the log ({end}): "
                   "the topic was probably deleted and recreated")
    else:
        return start
    if config.data_loss_policy != "skip":
        raise DataLossError(f"Data loss: {problem}. Nothing was planned and the ledger is unchanged. "
                            "Set data_loss_policy='skip' to continue from the log start and record the loss, "
                            "or rewind the pipeline.")
    plan.skipped.append(f"skipped: {problem}; continuing at {log_start}")
    plan.resets[tp] = (log_start, f"data loss skipped: {problem}")
    return log_start
