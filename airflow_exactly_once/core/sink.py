"""The sink side of the two-phase commit, in three small pieces.

As in Flink's Kafka connector (KafkaWriter, KafkaCommittable, KafkaCommitter) and PySpark's
Python data sources (DataSourceArrowWriter, WriterCommitMessage):

* a partition writer (`PartitionWriter`) runs on the Spark executors, writes one partition's
  rows staged and invisible, and returns a small picklable commit message;
* a committable (`Committable`) is what the driver makes of a batch's commit messages; it is
  stored in the ledger, as JSON handles, when the batch becomes PREPARED;
* the committer (`Sink.commit` / `abort` / `retract`) makes a batch's output visible or takes
  it away again from the committable alone, in any process, idempotently.

The framework owns the executor-to-driver plumbing (airflow_exactly_once.spark.runner runs
the writers and brings messages and errors back); a sink's `stage` only says what to run.
Nothing here imports PySpark: a DataFrame reaches `stage` as an object whose methods it calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Iterator

from airflow_exactly_once.core.claim import ClaimCheck
from airflow_exactly_once.core.config import GUARANTEES, PipelineConfig
from airflow_exactly_once.core.declaration import SinkSpec
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.handles import format_version, stamped
from airflow_exactly_once.core.lineage_names import DatasetName
from airflow_exactly_once.core.model import Batch

Handles = dict[str, Any]


def column_names(value: Any, what: str) -> tuple[str, ...]:
    """A spec's list of column names (a single name is a list of one); `what` names the setting in errors."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ConfigurationError(f"{what} must be a list of column names, not {value!r}")
    return tuple(value)


class Committable(ABC):
    """A batch's staged output, as its committer needs it; kept in the ledger as versioned JSON handles.

    Handles outlive the release that wrote them (a batch left PREPARED before an upgrade is committed
    after it), so a committable's format is versioned (core.handles): `write_handles` writes the format
    numbered `handles_version`, and a classmethod `read_handles_v<n>` reads each version n it ever wrote.
    To change the fields: raise `handles_version`, write the new format, add its reader, keep the old ones.
    `to_handles` and `from_handles` stamp and check the version; subclasses do not override them (a pair
    of committables writes each part's own handles, each with its version: records.dead_letter).
    """

    # The format `write_handles` writes. Handles from before formats were numbered are version 1.
    handles_version: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Checked when the class is made, not when a PREPARED batch is read after an upgrade: a committable
        that writes through `to_handles` has `write_handles`, and one that reads through `from_handles` has a
        reader for every version it wrote."""
        super().__init_subclass__(**kwargs)
        missing = []
        if cls.to_handles is Committable.to_handles and cls.write_handles is Committable.write_handles:
            missing.append("write_handles")
        if cls.from_handles.__func__ is Committable.from_handles.__func__:  # type: ignore[attr-defined]
            missing += [f"read_handles_v{v}" for v in range(1, cls.handles_version + 1)
                        if not callable(getattr(cls, f"read_handles_v{v}", None))]
        if missing:
            raise TypeError(f"{cls.__name__} (handles_version {cls.handles_version}) must define "
                            f"{', '.join(missing)}: see core.sink.Committable")

    @property
    def records(self) -> int | None:
        """How many records the attempt staged, if the committable knows (a count Spark did not report)."""
        return None

    def to_handles(self) -> Handles:
        """JSON for the ledger: this release's format, stamped with its version."""
        return stamped(self.write_handles(), self.handles_version)

    def write_handles(self) -> Handles:
        """The committable in the format numbered `handles_version`, without the version (to_handles adds it)."""
        raise NotImplementedError  # every subclass that writes through to_handles defines it (__init_subclass__)

    @classmethod
    def from_handles(cls, handles: Handles) -> "Committable":
        """Read handles of any version this committable wrote; HandlesVersionError for a newer one."""
        version = format_version(handles, cls.__name__, cls.handles_version)
        return getattr(cls, f"read_handles_v{version}")(handles)


class PartitionWriter(ABC):
    """Writes one Spark partition on an executor; pickled into the Spark task, so it holds plain settings."""

    @abstractmethod
    def write(self, partition: int, batches: Iterator[Any], claim: ClaimCheck | None = None) -> Any | None:
        """Write the partition's pyarrow RecordBatches staged; return its commit message (None: nothing staged).

        `claim.ensure(...)` right before the writer makes anything durable (begins a transaction,
        prepares one): a zombie attempt of an aborted batch then stages nothing.

        Raise an ExactlyOnceError (SinkError, ...) for what the sink understands: the runner
        carries it to the driver with its class and `retriable`.
        """


# How a sink gets its partition writers run: (DataFrame, writer) -> one commit message per partition.
RunWriters = Callable[[Any, PartitionWriter], list[Any]]

# The pipeline's batches whose committables the ledger still holds, each with its committable. A sink reads it
# only when it finds something left open in its system and must tell whether that is its own (a hanging Kafka
# transaction of an earlier batch); the coordinator binds it, a sink used without a ledger has none.
StagedHistory = Callable[[], list[tuple[Batch, Committable]]]


class Sink(ABC):
    """One sink type, built from a JSON spec, so it works after spark-submit too."""

    # The declaration of its spec: which keys it may hold, their defaults and choices, which are secret.
    spec_type: ClassVar[type[SinkSpec]] = SinkSpec
    # The guarantees this sink implements; staged-and-published sinks have only one.
    guarantees: ClassVar[tuple[str, ...]] = ("EXACTLY_ONCE",)
    # Whether committed output can be withdrawn again (rewinds, interval replacement).
    supports_retract: ClassVar[bool] = False
    # Whether the write may read a batch split into more Spark partitions than it has Kafka partitions: a sink
    # whose staged output is one thing however many partitions write it (a folder, a snapshot). A sink with a
    # transaction per Spark partition (Kafka, PostgreSQL) keeps one partition per offset range.
    splits_reads: ClassVar[bool] = False
    # Whether the write reads a batch in a task per core, several offset ranges (or parts of them) to a task: a
    # sink that pays per Spark partition (Kafka: a producer and a transaction each). See spark.job.read_layout.
    joins_reads: ClassVar[bool] = False
    committable_type: ClassVar[type[Committable]]

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec_type.check(spec)
        self.spec = spec
        self.pipeline: PipelineConfig | None = None
        self.history: StagedHistory | None = None

    @property
    def name(self) -> str:
        return self.type_name or type(self).__name__

    @property
    def type_name(self) -> str:
        """The sink type of its spec ("parquet"), as its declaration names it."""
        return self.spec_type.type_name

    @property
    def guarantee(self) -> str:
        return str(self.spec.get("guarantee") or "EXACTLY_ONCE")

    def bind(self, config: PipelineConfig, history: StagedHistory | None = None) -> "Sink":
        """Give the sink the pipeline settings it may share (servers, client settings), and the ledger's
        record of what the pipeline's batches staged (`history`), when a ledger is at hand."""
        if self.guarantee not in GUARANTEES or self.guarantee not in self.guarantees:
            raise ConfigurationError(f"the {self.name} sink does not implement guarantee={self.guarantee!r}; "
                                     f"choose one of {', '.join(self.guarantees)}")
        self.pipeline = config
        self.history = history
        return self

    def lineage_dataset(self) -> DatasetName | None:
        """Where the sink writes, named as OpenLineage names datasets (the operators report it when the
        OpenLineage provider is installed); None: the sink has no name there and lineage shows no output."""
        return None

    def commit_deadline_ms(self) -> int | None:
        """How long staged output survives before the sink discards it; None: until aborted.

        The plan task checks the DAG's retry settings against it (a commit that comes later
        finds the output gone and the batch is processed again).
        """
        return None

    def check(self, pipeline_id: str) -> None:
        """Plan-time validation against the real system (permissions, server settings)."""

    def spark_packages(self) -> list[str]:
        """Maven coordinates of JVM libraries the write's Spark needs beyond Kafka's connector.

        Loaded like the Kafka connector (airflow_exactly_once.spark.connector): the user's own
        Spark settings win, else Spark resolves them itself. `{spark_line}` ("4.0") and `{scala}`
        ("2.13") in them are filled in with the installed pyspark's.
        """
        return []

    # -- write (the driver, in the Spark job) --------------------------------------

    @abstractmethod
    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> Committable:
        """Write `frame` (a Spark DataFrame) staged and invisible; on failure remove what this attempt staged.

        `batch.epoch` identifies the attempt (each write attempt claims the batch anew).
        """

    def stage_batch(self, good: Any, bad: Any | None, batch: Batch, run_writers: RunWriters) -> Committable:
        """Stage a batch's good records, and its bad ones if the sink has a dead-letter destination
        (records.dead_letter.SinkWithDeadLetters); a plain sink never receives bad records."""
        if bad is not None:
            raise ValueError(f"the {self.name} sink has no dead-letter destination for bad records")
        return self.stage(good, batch, run_writers)

    def shape_dead_letters(self, frame: Any) -> Any:
        """Dead-letter records (records.bad_records.DEAD_LETTER_COLUMNS) as this sink writes them, when it is a
        pipeline's dead-letter destination."""
        return frame

    # -- the committer (notify_complete, abort, recovery, rewinds) -------------------

    def verify_staged(self, batch: Batch, committable: Committable) -> None:
        """Raise TransactionLostError if the staged output is gone, without committing anything.

        Lets a commit of several sinks (output and dead letters) find a loss before any of them
        becomes visible; a sink without a cheap check relies on its commit finding it.
        """

    def committable(self, handles: Handles | None) -> Committable | None:
        """The committable stored as a batch's handles (None when the batch recorded none)."""
        return self.committable_type.from_handles(handles) if handles else None

    @abstractmethod
    def commit(self, batch: Batch, committable: Committable) -> str:
        """Make the staged output visible. Idempotent. Raises TransactionLostError if it is gone."""

    @abstractmethod
    def abort(self, batch: Batch, committable: Committable | None) -> str:
        """Discard the staged output of `committable` (one attempt), or of every attempt of `batch` (None)."""

    def retract(self, batch: Batch, committable: Committable | None) -> str:
        """Remove the committed output of `batch` (a rewind, or replaced by a re-run). Idempotent."""
        raise ConfigurationError(
            f"the {self.name} sink cannot withdraw committed output: rewind with --output keep (the range is "
            "delivered again) or re-run intervals with interval_rerun='noop'")

    def commit_replacing(self, batch: Batch, committable: Committable, replaced: Batch) -> str:
        """Commit `batch` in place of the committed output of `replaced`. Idempotent.

        The default publishes first and withdraws the old output after, so a crash in
        between can show both for a moment but never loses data; sinks that can swap
        atomically override it.
        """
        outcome = self.commit(batch, committable)
        return f"{outcome}; {self.retract(replaced, self.committable(replaced.handles))}"
