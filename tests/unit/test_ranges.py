"""Fixing a batch's range from positions and offsets: pure functions, no Kafka."""

from __future__ import annotations

import pytest

from airflow_exactly_once.core.errors import ConfigurationError, DataLossError
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.ranges import continuation_ranges
from tests.harness import pipeline_config


def config(**overrides):
    return pipeline_config("p", ["t"], {"type": "parquet", "path": "/tmp/x"}, **overrides)


def test_startup_modes_and_bounds():
    tps = [("t", 0), ("t", 1)]
    starts, ends = {("t", 0): 2, ("t", 1): 0}, {("t", 0): 50, ("t", 1): 3}
    earliest = continuation_ranges(config(max_records_per_partition=10), {}, tps, starts, ends)
    assert earliest.ranges == [OffsetRange("t", 0, 2, 12), OffsetRange("t", 1, 0, 3)]
    assert earliest.new_partitions == {("t", 0): (2, "startup mode earliest"), ("t", 1): (0, "startup mode earliest")}
    latest = continuation_ranges(config(startup_mode="latest"), {}, tps, starts, ends)
    assert latest.is_empty and latest.new_partitions[("t", 0)][0] == 50


def test_continues_from_committed_and_picks_up_new_partitions():
    plan = continuation_ranges(config(new_partition_start="latest"), {("t", 0): 40}, [("t", 0), ("t", 1)],
                               {("t", 0): 0, ("t", 1): 0}, {("t", 0): 50, ("t", 1): 9})
    assert plan.ranges == [OffsetRange("t", 0, 40, 50), OffsetRange("t", 1, 9, 9)]
    assert plan.new_partitions == {("t", 1): (9, "new partition, latest")}


@pytest.mark.parametrize("position, log_start, end", [(5, 20, 30), (80, 0, 10)])
def test_data_loss_fails_loudly_unless_skip(position, log_start, end):
    args = ({("t", 0): position}, [("t", 0)], {("t", 0): log_start}, {("t", 0): end})
    with pytest.raises(DataLossError, match="data_loss_policy='skip'"):
        continuation_ranges(config(), *args)
    plan = continuation_ranges(config(data_loss_policy="skip"), *args)
    assert plan.ranges == [OffsetRange("t", 0, log_start, end)] and len(plan.skipped) == 1
    assert plan.resets == {("t", 0): (log_start, plan.resets[("t", 0)][1])}


def test_vanished_partition_is_data_loss():
    with pytest.raises(DataLossError, match="no longer exists"):
        continuation_ranges(config(), {("t", 0): 5, ("t", 1): 5}, [("t", 0)], {("t", 0): 0}, {("t", 0): 9})


def test_a_pipeline_id_reused_for_other_topics_is_named_as_such():
    """Not 'data loss': the pipeline's topics changed; the message says from what to what and what to do."""
    with pytest.raises(ConfigurationError) as error:
        continuation_ranges(config(), {("t04", 0): 100}, [("t", 0)], {("t", 0): 0}, {("t", 0): 9})
    text = str(error.value)
    assert "['t04']" in text and "['t']" in text and "its own pipeline_id" in text
