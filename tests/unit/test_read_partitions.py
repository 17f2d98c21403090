"""Which batches the write reads split into more Spark partitions than Kafka's (spark.job.read_partitions)."""

from __future__ import annotations

from types import SimpleNamespace

from airflow_exactly_once.core.model import Batch, OffsetRange
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.records.dead_letter import SinkWithDeadLetters
from airflow_exactly_once.sinks import create_sink
from airflow_exactly_once.spark.job import SPLIT_PART_RECORDS, read_partitions

SPARK = SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=3))  # a classic session's parallelism


def batch(records: int) -> Batch:
    half = records // 2
    return Batch("p", 1, "run-1", BatchState.PLANNED, 1,
                 (OffsetRange("t", 0, 0, half), OffsetRange("t", 1, 5, 5 + records - half)))


def cores(n: int) -> SimpleNamespace:
    return SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=n))


def test_a_large_batch_of_a_staged_sink_is_split_into_whole_rounds_of_the_cores(tmp_path):
    parquet = create_sink({"type": "parquet", "path": str(tmp_path)})
    large = 10 * SPLIT_PART_RECORDS
    assert read_partitions(SPARK, batch(large), parquet) == 6  # 2 ranges, 3 cores: 4 -> 6
    assert read_partitions(cores(2), batch(large), parquet) == 4
    assert read_partitions(cores(8), batch(large), parquet) == 8
    assert read_partitions(cores(8), batch(8 * SPLIT_PART_RECORDS - 1), parquet) is None  # parts too small to pay
    assert read_partitions(cores(2), batch(4 * SPLIT_PART_RECORDS), parquet) == 4  # parts just large enough
    assert read_partitions(cores(2), batch(4 * SPLIT_PART_RECORDS - 1), parquet) is None
    assert read_partitions(cores(1), batch(large), parquet) is None  # one core: nothing to balance
    assert read_partitions(cores(2), wide(large, 3), parquet) == 6  # 3 ranges, 2 cores
    assert read_partitions(cores(2), wide(large, 4), parquet) is None  # enough ranges already


def wide(records: int, ranges: int) -> Batch:
    each = records // ranges + 1
    return Batch("p", 1, "run-1", BatchState.PLANNED, 1,
                 tuple(OffsetRange("t", p, 0, each) for p in range(ranges)) + (OffsetRange("t", ranges, 9, 9),))


def test_sinks_with_a_transaction_per_spark_partition_are_never_split(tmp_path):
    kafka = create_sink({"type": "kafka", "topic": "out"})
    parquet = create_sink({"type": "parquet", "path": str(tmp_path)})
    assert read_partitions(SPARK, batch(10 * SPLIT_PART_RECORDS), kafka) is None
    assert read_partitions(SPARK, batch(10 * SPLIT_PART_RECORDS), SinkWithDeadLetters(parquet, kafka)) is None
    assert read_partitions(SPARK, batch(10 * SPLIT_PART_RECORDS), SinkWithDeadLetters(parquet, parquet)) == 6
