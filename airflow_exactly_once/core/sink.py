"""The sink side of the two-phase commit, in small pieces.

As in Flink's Kafka connector (KafkaWriter, KafkaCommittable, KafkaCommitter) and PySpark's
Python data sources (DataSourceArrowWriter, WriterCommitMessage):

* a partition writer (`PartitionWriter`) runs on the Spark executors, writes one partition's
  rows staged and invisible, and returns a small picklable commit message;
* the sink's writer (core.sink_writer.SinkWriter) stages a batch on the Spark driver: it says
  which partition writers to run, and makes their commit messages a committable;
* a committable (`Committable`) is stored in the ledger, as JSON handles, when the batch becomes
  PREPARED;
* the sink's committer (core.sink_committer.SinkCommitter) makes a batch's output visible or
  takes it away again from the committable alone, in any process, idempotently.

Writer and committer are made from the same spec and share `SinkSide` (below); the processes
that commit (notify_complete, recovery, the CLI) never build a writer. The framework owns the
executor-to-driver plumbing (airflow_exactly_once.spark.partition_writers runs the writers and brings
messages and errors back); a writer's `stage` only says what to run. Nothing here imports
PySpark: a DataFrame reaches `stage` as an object whose methods it calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Iterable, Iterator, Protocol, TypeVar

from airflow_exactly_once.core.claim import ClaimCheck
from airflow_exactly_once.core.config import GUARANTEES, PipelineConfig
from airflow_exactly_once.core.declaration import SinkSpec
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.handles import format_version, stamped
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.states import BatchState

__all__ = ["Committable", "PartitionWriter", "LedgerReader", "SinkSide"]

Handles = dict[str, Any]
# A committable type: `from_handles` of StagedFolder gives a StagedFolder, a Parquet committer commits StagedFolders.
CommittableT = TypeVar("CommittableT", bound="Committable")


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
    of committables writes each part's own handles, each with its version: sinks.dead_letters).
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
    def from_handles(cls: type[CommittableT], handles: Handles) -> CommittableT:
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

        Raise an ExactlyOnceError (SinkError, ...) for what the sink understands: spark.partition_writers
        carries it to the driver with its class and `retriable`.
        """


# How a sink gets its partition writers run: (DataFrame, writer) -> one commit message per partition.
RunWriters = Callable[[Any, PartitionWriter], list[Any]]

# The pipeline's batches whose committables the ledger still holds, each with its committable. A sink reads it
# only when it finds something left open in its system and must tell whether that is its own (a hanging Kafka
# transaction of an earlier batch); the coordinator binds it, a sink used without a ledger has none.
StagedHistory = Callable[[], list[tuple[Batch, CommittableT]]]


class LedgerReader(Protocol):
    """The reads of the ledger a sink may make beyond its own committables (core.ledger.Ledger has them).

    A sink that reuses names across batches (Kafka's pooled transactional ids) must see which of its
    pipeline's batches are still open, and which names the ledger's other pipelines use; the coordinator
    binds the ledger, a sink used without one has none.
    """

    def list_batches(self, pipeline_id: str, states: Iterable[BatchState] | None = None) -> list[Batch]: ...

    def pending_releases(self, pipeline_id: str) -> list[Batch]: ...

    def list_pipelines(self) -> list[dict[str, Any]]: ...


class SinkSide:
    """What a sink's writer and its committer share: the spec both are made from, checked against the sink
    type's declaration, and the delivery guarantee it asks for."""

    # The declaration of its spec: which keys it may hold, their defaults and choices, which are secret.
    spec_type: ClassVar[type[SinkSpec]] = SinkSpec
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec_type.check(spec)
        self.spec = spec
        self.pipeline: PipelineConfig | None = None

    @property
    def name(self) -> str:
        return self.type_name or type(self).__name__

    @property
    def type_name(self) -> str:
        """The sink type of its spec ("parquet"), as its declaration names it."""
        return self.spec_type.type_name

    @property
    def guarantees(self) -> tuple[str, ...]:
        """The guarantees this sink implements, as its declaration states them (staged-and-published sinks: one)."""
        return self.spec_type.guarantees

    @property
    def guarantee(self) -> str:
        return str(self.spec.get("guarantee") or "EXACTLY_ONCE")

    def bind_pipeline(self, config: PipelineConfig) -> None:
        """Give the sink the pipeline settings it may share (servers, client settings), once its guarantee is
        known to be one it implements."""
        if self.guarantee not in GUARANTEES or self.guarantee not in self.guarantees:
            raise ConfigurationError(f"the {self.name} sink does not implement guarantee={self.guarantee!r}; "
                                     f"choose one of {', '.join(self.guarantees)}")
        self.pipeline = config
