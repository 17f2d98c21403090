"""The write side of a sink: what the write step (spark.write_job) uses to stage a batch on the Spark driver.

A writer says which partition writers to run and makes their commit messages the batch's
committable. What a failed stage leaves behind is taken away by the sink's committer, the
coordinator's (bound with the ledger's history), so a writer is bound to it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.line_packages import LinePackage
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import Committable, RunWriters, SinkSide
from airflow_exactly_once.core.sink_committer import SinkCommitter

__all__ = ["SinkWriter"]


class SinkWriter(SinkSide, ABC):
    """Stages a batch's output, invisible to readers; built from the sink's JSON spec, so it works after
    spark-submit too."""

    # Whether the write may read a batch split into more Spark partitions than it has Kafka partitions: a sink
    # whose staged output is one thing however many partitions write it (a folder, a snapshot). A sink with a
    # transaction per Spark partition (Kafka, PostgreSQL) keeps one partition per offset range.
    splits_reads: ClassVar[bool] = False
    # Whether the write reads a batch in a task per core, several offset ranges (or parts of them) to a task: a
    # sink that pays per Spark partition (Kafka: a producer and a transaction each). See spark.batch_read.read_layout.
    joins_reads: ClassVar[bool] = False
    # Whether staging changes the Spark session's settings while it runs (Iceberg's spark.wap.id): such a write
    # gets a Spark Connect session of its own per attempt; the others share their pipeline's session, where another
    # write of the pipeline may run at the same time (spark.connect_server.pipeline_session).
    changes_session_conf: ClassVar[bool] = False

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.committer: SinkCommitter | None = None

    def bind(self, config: PipelineConfig, committer: SinkCommitter) -> "SinkWriter":
        """The pipeline's settings, and the committer of the same sink (the coordinator's) that takes away what
        a failed stage left behind."""
        self.bind_pipeline(config)
        self.committer = committer
        return self

    def spark_packages(self) -> list[str | LinePackage]:
        """Maven coordinates of JVM libraries the write's Spark needs beyond Kafka's connector.

        Loaded like the Kafka connector (airflow_exactly_once.spark.packages): the user's own
        Spark settings win, else Spark resolves them itself. `{spark_line}` ("4.0") and `{scala}`
        ("2.13") in them are filled in with the installed pyspark's. A library built for some
        Spark lines only is a LinePackage (declare it in the spec's `line_packages` too, for
        the check when a DAG is parsed).
        """
        return []

    @abstractmethod
    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> Committable:
        """Write `frame` (a Spark DataFrame) staged and invisible; on failure remove what this attempt staged.

        `batch.epoch` identifies the attempt (each write attempt claims the batch anew).
        """

    def stage_batch(self, good: Any, bad: Any | None, batch: Batch, run_writers: RunWriters) -> Committable:
        """Stage a batch's good records, and its bad ones if the sink has a dead-letter destination
        (sinks.dead_letters.PairedWriter); a plain sink never receives bad records."""
        if bad is not None:
            raise ValueError(f"the {self.name} sink has no dead-letter destination for bad records")
        return self.stage(good, batch, run_writers)

    def shape_dead_letters(self, frame: Any) -> Any:
        """Dead-letter records (records.bad_records.DEAD_LETTER_COLUMNS) as this sink writes them, when it is a
        pipeline's dead-letter destination."""
        return frame
