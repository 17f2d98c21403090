"""Driving batches through the protocol without Airflow: one harness for every tier.

`Pipe` is a pipeline on a real ledger: `plan` (core.planning with the given offset source),
`write` (claim, the sink's writer stages a DataFrame, prepare: what the Spark job does), `commit`
(notify_complete) and `abort`. Unit tests give it a fake source and a writer that needs no
Spark; integration tests give it real Kafka, Spark and sinks.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import Batch, BatchId, OffsetRange
from airflow_exactly_once.core.planning import PlanOutcome, plan_batch
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.sink import Committable, RunWriters
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.core.sink_writer import SinkWriter
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import pipeline_committer, pipeline_writer
from airflow_exactly_once.sinks.parquet.committable import StagedFolder
from airflow_exactly_once.sinks.parquet.sink_writer import ParquetSinkWriter

REPO = Path(__file__).resolve().parent.parent


def open_ledger(url_or_path: str | Path) -> Ledger:
    """A ledger at a SQLAlchemy URL or a SQLite file path, schema created."""
    url = str(url_or_path) if "://" in str(url_or_path) else f"sqlite:///{url_or_path}"
    ledger = Ledger(url)
    ledger.create_schema()
    return ledger


def airflow_ledger(stack: Any) -> Ledger:
    """The embedded ledger of a devtools AirflowStack (the SQLite file in its AIRFLOW_HOME)."""
    from airflow_exactly_once.hooks.ledger import EMBEDDED_LEDGER_FILE

    return Ledger(f"sqlite:///{stack.home / EMBEDDED_LEDGER_FILE}")


def operator_cli(stack: Any, *args: str) -> subprocess.CompletedProcess:
    """`airflow-exactly-once ARGS` on the stack's embedded ledger, as an operator runs it on the Airflow host (with
    Airflow's configuration: the drift check reads its Asset events)."""
    command = [sys.executable, "-m", "airflow_exactly_once.cli", "--ledger-url",
               str(airflow_ledger(stack).engine.url), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**stack.env(), "PYTHONPATH": str(REPO)})


def asset_events(stack: Any, dag: str, run_id: str | None = None) -> list[dict]:
    """The Asset events a DAG's runs (or one run) recorded, through Airflow's REST API."""
    query = f"/assets/events?source_dag_id={dag}&limit=100" + (f"&source_run_id={quote(run_id)}" if run_id else "")
    return stack.api("GET", query)["asset_events"]


def pipeline_config(pipeline_id: str, topics: list[str], sink: dict[str, Any], bootstrap: str = "127.0.0.1:9",
                    **overrides: Any) -> PipelineConfig:
    return checked(PipelineConfig(pipeline_id=pipeline_id, topics=topics, sink=sink, bootstrap_servers=bootstrap,
                          **overrides))


class FakeSource:
    """Answers like Kafka would for partitions holding offsets up to `ends`."""

    def __init__(self, ends: dict[tuple[str, int], int], starts: dict[tuple[str, int], int] | None = None):
        self.ends = ends
        self.starts = starts or {tp: 0 for tp in ends}

    def partitions(self, topics):
        return [tp for tp in self.ends if tp[0] in topics]

    def cluster_partitions(self):
        return {topic: sorted(p for t, p in self.ends if t == topic) for topic, _ in self.ends}

    def log_start_offsets(self, tps):
        return {tp: self.starts[tp] for tp in tps}

    def end_offsets(self, tps):
        return {tp: self.ends[tp] for tp in tps}

    def offsets_for_times(self, tps, timestamp_ms):
        return {tp: None for tp in tps}

    def group_offsets(self, group_id, tps):
        return {tp: None for tp in tps}

    def close(self):
        pass


class MarkerWriter(ParquetSinkWriter):
    """A Parquet sink writer whose stage writes a marker file instead of running Spark (unit tests); the
    Parquet committer publishes it.

    Use it as `Pipe(..., writer_factory=MarkerWriter.of)`."""

    @classmethod
    def of(cls, config: PipelineConfig) -> "MarkerWriter":
        return cls(config.sink)

    def stage(self, frame, batch, run_writers):
        staging = self.layout.staging_dir(batch)
        staging.mkdir(parents=True)
        (staging / "part-0.parquet").write_text(repr(batch.ranges))
        return StagedFolder(str(staging), str(self.layout.final_dir(batch)), ("part-0.parquet",))


def no_spark(frame: Any, writer: Any) -> list[Any]:
    raise AssertionError("this sink was not expected to run partition writers")


@dataclass
class Pipe:
    config: PipelineConfig
    ledger: Ledger
    source_factory: Callable[[], Any]
    run_writers: RunWriters = no_spark
    committer_factory: Callable[[PipelineConfig], SinkCommitter] = pipeline_committer
    writer_factory: Callable[[PipelineConfig], SinkWriter] = pipeline_writer
    coordinator: BatchCoordinator = field(init=False)
    writer: SinkWriter = field(init=False)

    def __post_init__(self) -> None:
        self.coordinator = BatchCoordinator(self.config, self.ledger, self.committer_factory(self.config))
        self.writer = self.writer_factory(self.config).bind(self.config, self.coordinator.sink)

    @property
    def sink(self):
        """The sink's committer, as the coordinator holds it."""
        return self.coordinator.sink

    def new_coordinator(self) -> BatchCoordinator:
        """Another process's view (a retried task, the next run): same ledger, new committer object."""
        return BatchCoordinator(self.config, self.ledger, self.committer_factory(self.config))

    def plan(self, run_id: str, interval: tuple[int, int] | None = None) -> PlanOutcome:
        return plan_batch(self.coordinator, self.source_factory, run_id, interval)

    def claim(self, batch_id: BatchId) -> Batch:
        return self.coordinator.claim(batch_id)

    def stage(self, frame: Any, batch: Batch) -> Committable:
        return self.writer.stage(frame, batch, self.run_writers)

    def write(self, batch_id: BatchId, frame: Any = None, records: int | None = None) -> Batch:
        """The write task: claim, stage, prepare. `records` is what the counts say (default: the offsets)."""
        claimed = self.claim(batch_id)
        committable = self.stage(frame, claimed)
        count = claimed.offset_span if records is None else records
        return self.coordinator.prepare(claimed, committable, count, count)

    def commit(self, batch_id: BatchId) -> str:
        return self.coordinator.commit(batch_id)

    def abort(self, batch_id: BatchId, reason: str = "the run failed") -> str:
        return self.coordinator.abort(batch_id, reason)

    def state(self, batch_id: BatchId) -> BatchState:
        return self.ledger.get_batch(batch_id).state

    def planted_batch(self, run_id: str, ranges: list[OffsetRange]) -> Batch:
        """A PLANNED batch of `ranges`, recorded directly (sink tests that need no planning)."""
        self.ledger.ensure_pipeline(self.config.pipeline_id, self.config.fingerprint(), self.config.to_stored_dict())
        epoch = self.ledger.pipeline(self.config.pipeline_id)["epoch"]
        return self.ledger.create_batch(self.config.pipeline_id, run_id, ranges, expected_epoch=epoch)
