"""Which batches the write reads split into more Spark partitions than Kafka's, or joined into fewer
(spark.batch_read.read_layout)."""

from __future__ import annotations

from types import SimpleNamespace

from airflow_exactly_once.core.model import Batch, OffsetRange
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.sinks import create_writer
from airflow_exactly_once.sinks.dead_letters import PairedWriter
from airflow_exactly_once.spark.batch_read import SPLIT_PART_RECORDS, ReadLayout, read_layout

SPARK = SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=3))  # a classic session's parallelism


def batch(records: int) -> Batch:
    half = records // 2
    return Batch("p", 1, "run-1", BatchState.PLANNED, 1,
                 (OffsetRange("t", 0, 0, half), OffsetRange("t", 1, 5, 5 + records - half)))


def cores(n: int) -> SimpleNamespace:
    return SimpleNamespace(sparkContext=SimpleNamespace(defaultParallelism=n))


def read_partitions(spark, batch: Batch, sink) -> int | None:
    layout = read_layout(spark, batch, sink)
    assert layout is None or layout.tasks is None
    return None if layout is None else layout.parts


def test_a_large_batch_of_a_staged_sink_is_split_into_whole_rounds_of_the_cores(tmp_path):
    parquet = create_writer({"type": "parquet", "path": str(tmp_path)})
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


def test_sinks_with_a_transaction_per_spark_partition_split_only_to_join_again(tmp_path):
    kafka = create_writer({"type": "kafka", "topic": "out"})
    postgres = create_writer({"type": "postgres", "table": "t", "conn_id": "pg"})
    parquet = create_writer({"type": "parquet", "path": str(tmp_path)})
    large = 10 * SPLIT_PART_RECORDS
    # 2 ranges on 3 cores: 6 parts, a core's share (2 parts) to each of 3 tasks
    assert read_layout(SPARK, batch(large), kafka) == ReadLayout(parts=6, tasks=3)
    assert read_layout(cores(2), wide(large, 3), kafka) == ReadLayout(parts=6, tasks=2)  # 3 tasks would take 2 rounds
    assert read_layout(cores(2), wide(large, 1), kafka) == ReadLayout(parts=2, tasks=2)
    assert read_layout(cores(2), wide(6 * SPLIT_PART_RECORDS - 30, 3), kafka) is None  # parts too small to pay
    assert read_layout(SPARK, batch(large), PairedWriter(kafka, kafka)) == ReadLayout(parts=6, tasks=3)
    for neither in (postgres, PairedWriter(parquet, kafka)):  # a transaction per part: never split
        assert read_layout(SPARK, batch(large), neither) is None
    assert read_partitions(SPARK, batch(large), PairedWriter(parquet, parquet)) == 6


def test_a_sink_paying_per_partition_reads_many_ranges_in_a_task_per_core(tmp_path):
    kafka = create_writer({"type": "kafka", "topic": "out"})
    postgres = create_writer({"type": "postgres", "table": "t", "conn_id": "pg"})
    parquet = create_writer({"type": "parquet", "path": str(tmp_path)})
    assert read_layout(cores(2), wide(100, 12), kafka) == ReadLayout(tasks=2)  # 12 transactions -> 2
    assert read_layout(cores(2), wide(100, 4), kafka) == ReadLayout(tasks=2)  # twice the cores: joined
    assert read_layout(cores(2), wide(100, 3), kafka) is None  # fewer: a task per range
    assert read_layout(cores(1), wide(100, 2), kafka) == ReadLayout(tasks=1)
    assert read_layout(cores(8), wide(100, 12), kafka) is None
    assert read_layout(cores(2), wide(100, 12), PairedWriter(kafka, kafka)) == ReadLayout(tasks=2)
    for other in (parquet, postgres, PairedWriter(kafka, parquet)):  # they gain nothing from it
        assert read_layout(cores(2), wide(100, 12), other) is None


def test_a_spark_connect_session_keeps_a_partition_per_range(tmp_path):
    connect = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})()  # no sparkContext
    assert read_layout(connect, wide(100, 12), create_writer({"type": "kafka", "topic": "out"})) is None
