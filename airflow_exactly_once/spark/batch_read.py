"""How the write reads a batch: exactly its planned offsets, in as many Spark partitions as suit the cores and
the sink.

The write (spark.write_job) only asks for a batch's records; planning their read is this module's: the options
of Spark's Kafka source (kafka_read_options), the consumer group all of a pipeline's reads share (reader_group),
how many Spark partitions the read makes (read_layout), and a small batch read here instead, by kafka.range_read,
as a local relation (read_batch).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink_writer import SinkWriter
from airflow_exactly_once.kafka import range_read
from airflow_exactly_once.kafka.setting_names import SECRETS
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.spark import records

FETCH_MAX_WAIT_MS = "10"  # Spark's Kafka reader: see kafka_read_options
# A batch is read in more Spark partitions than Kafka's only when each part keeps this many records: each
# extra task opens a Kafka consumer of its own (read_layout).
SPLIT_PART_RECORDS = 150_000
KAFKA_SOURCE_SCHEMA = ", ".join(f"{name} {sql_type}" for name, sql_type in records.KAFKA_SOURCE_COLUMNS)


def kafka_read_options(batch: Batch, config: PipelineConfig) -> dict[str, str]:
    """Options of Spark's Kafka batch source for exactly the batch's non-empty ranges."""
    ranges = [r for r in batch.ranges if r.size > 0]
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    assign: dict[str, list[int]] = {}
    for r in ranges:
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.start
        ending.setdefault(r.topic, {})[str(r.partition)] = r.end
    settings = KafkaSettings.of(config)
    options = {
        # Spark's Kafka reader waited the broker's full fetch.max.wait.ms (500 ms by default) on each partition's
        # fetches of a range, most of a small batch's read (docs/benchmarks.md, benchmarks/bench_dag_run.py).
        # A fetch with data returns at once either way; a kafka_config value wins.
        "kafka.fetch.max.wait.ms": FETCH_MAX_WAIT_MS,
        **settings.spark_source_options(),
        "kafka.group.id": reader_group(settings, config.pipeline_id),  # pooled consumers (reader_group)
        "assign": json.dumps(assign),
        "startingOffsets": json.dumps(starting),
        "endingOffsets": json.dumps(ending),
        "kafka.isolation.level": "read_committed",
        # A planned offset that is gone must fail the batch, never be skipped silently.
        "failOnDataLoss": "true",
    }
    return options


def reader_group(settings: KafkaSettings, pipeline_id: str) -> str:
    """The group id of a pipeline's reads in Spark (which assigns partitions: it never joins or commits).

    Spark's executors pool their consumers by group id and partition, and name a batch read's group anew
    each time: with one id per pipeline a warm executor's consumer reads the next batch too (a
    consumer less to open per small write: docs/benchmarks.md). The digest of the connection's settings
    (servers, security, user; never a secret) keeps a consumer of the old cluster or user from serving a
    pipeline whose connection changed.
    """
    shown = {k: v for k, v in settings.java().items() if k not in SECRETS}
    if settings.uses_oauth:
        shown["sasl.oauthbearer.client.id"] = settings.oauth_client().client_id
    elif settings.security_protocol.startswith("SASL"):
        shown["sasl.username"] = settings.sasl_login()[0]
    digest = hashlib.sha256(json.dumps(shown, sort_keys=True).encode()).hexdigest()[:12]
    return f"airflow-exactly-once-{pipeline_id}-{digest}"


@dataclass(frozen=True)
class BatchInput:
    """A batch's records as a DataFrame, and their number when it is known without Spark (a small batch read
    here: the rows it read), which spares the write an Observation of its input."""

    frame: Any
    records: int | None = None


def read_batch(spark, batch: Batch, config: PipelineConfig, layout: ReadLayout | None = None) -> BatchInput:
    """The batch's records from Kafka, one Spark partition per offset range unless `layout` (read_layout) says
    otherwise; a batch of at most `local_read_max_records` offsets is read here (kafka.range_read) and becomes a
    local relation, which Spark slices by its parallelism."""
    tasks = layout.tasks if layout is not None else None
    if 0 < batch.offset_span <= config.local_read_max_records:
        settings = KafkaSettings.of(config)
        rows = range_read.read_ranges(settings, reader_group(settings, config.pipeline_id), batch.ranges)
        if rows is not None:
            frame = local_frame(spark, rows)
            return BatchInput(frame.coalesce(tasks) if tasks else frame, len(rows))
    options = kafka_read_options(batch, config)
    if layout is not None and layout.parts:
        options["minPartitions"] = str(layout.parts)
    frame = spark.read.format("kafka").options(**options).load()
    return BatchInput(frame.coalesce(tasks) if tasks else frame)


def local_frame(spark, rows: list) -> Any:
    """Records read by kafka.range_read as the DataFrame Spark's Kafka source gives (its columns and types)."""
    import pyarrow as pa
    import pyspark

    arrow_types = {"BINARY": pa.binary(), "STRING": pa.string(), "INT": pa.int32(), "BIGINT": pa.int64(),
                   "TIMESTAMP": pa.timestamp("ms", tz="UTC")}  # range_read's timestamps are epoch milliseconds
    columns = list(zip(*rows)) if rows else [()] * len(records.KAFKA_SOURCE_COLUMNS)
    table = pa.table({name: pa.array(column, arrow_types[sql_type])
                      for (name, sql_type), column in zip(records.KAFKA_SOURCE_COLUMNS, columns)})
    if int(pyspark.__version__.split(".")[0]) < 4:  # PySpark 3.5 takes pandas, not a pyarrow Table
        return spark.createDataFrame(table.to_pandas(), schema=KAFKA_SOURCE_SCHEMA)
    return spark.createDataFrame(table)


@dataclass(frozen=True)
class ReadLayout:
    """How the write reads a batch: `parts` (Spark's `minPartitions`) splits few offset ranges into more Spark
    partitions; `tasks` (a coalesce, no shuffle) reads many ranges several to a Spark partition."""
    parts: int | None = None
    tasks: int | None = None


def read_layout(spark, batch: Batch, writer: SinkWriter) -> ReadLayout | None:
    """How many Spark partitions the write reads `batch` into; None: one per offset range.

    With a task per Kafka partition, 3 partitions on 2 cores leave a core idle for the last third of the
    write. When a batch has fewer ranges than twice the cores, each range is read in two or more parts, so
    many that the tasks come in whole rounds of the cores (3 ranges on 2 cores: 6 tasks). Spark splits each
    range in proportion to its size, at offsets the range fixes, so a retry reads the same parts. Each extra
    task opens a Kafka consumer of its own, so parts must stay large (SPLIT_PART_RECORDS): a large batch
    read in parts is faster, a small one slower (docs/benchmarks.md). Only for sinks whose output does not grow with Spark's partitions
    (SinkWriter.splits_reads), and classic sessions (a Spark Connect client does not see the server's cores).

    A sink that pays per Spark partition (SinkWriter.joins_reads: a producer and a transaction each) reads the
    batch in as many tasks as cores: a batch of at least twice as many ranges as cores whole ranges to a task (the
    same rounds of the cores, fewer producers and transactions, larger batches to the broker); a large one of
    fewer ranges split as above and the parts joined again, a core's share to a task (3 ranges on 2 cores: 6
    parts in 2 tasks, one round where a task per range takes two).
    """
    if is_connect(spark):
        return None
    cores = spark.sparkContext.defaultParallelism
    ranges = sum(1 for r in batch.ranges if r.size > 0)
    if ranges >= 2 * cores:
        return ReadLayout(tasks=cores) if writer.joins_reads else None
    if cores < 2 or not (writer.splits_reads or writer.joins_reads):
        return None
    parts = cores * -(-2 * ranges // cores)
    if batch.offset_span < parts * SPLIT_PART_RECORDS:
        return None
    return ReadLayout(parts=parts, tasks=cores if writer.joins_reads else None)


def is_connect(spark) -> bool:
    """A Spark Connect session (pyspark.sql.connect), not a classic one with a driver in this process."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
