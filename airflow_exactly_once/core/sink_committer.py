"""The commit side of a sink: what notify_complete, recovery, abort, rewinds and the plan's checks hold.

A committer works from a batch's committable alone (read back from the ledger's handles), in
any process, idempotently; it never stages anything, so the processes that commit never build
a sink's write side (core.sink_writer) nor need PySpark.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.lineage_names import DatasetName
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import CommittableT, Handles, LedgerReader, SinkSide, StagedHistory

__all__ = ["SinkCommitter"]


class SinkCommitter(SinkSide, ABC, Generic[CommittableT]):
    """Makes a staged batch visible, takes it away, withdraws it; built from the sink's JSON spec.

    Generic in its committable type: a sink's committer receives only the committables it made from its own
    handles (`committable`), so its methods take that type and the type checker holds them to it."""

    # Whether committed output can be withdrawn again (rewinds, interval replacement).
    supports_retract: ClassVar[bool] = False
    # Set by each sink's committer class (a ClassVar cannot hold a type variable).
    committable_type: type[CommittableT]

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.history: StagedHistory[CommittableT] | None = None
        self.ledger: LedgerReader | None = None

    def bind(self, config: PipelineConfig, history: StagedHistory[CommittableT] | None = None,
             ledger: LedgerReader | None = None) -> "SinkCommitter[CommittableT]":
        """The pipeline's settings, and the ledger's record of what the pipeline's batches staged (`history`)
        and its reads (`ledger`), when a ledger is at hand (the coordinator binds all three)."""
        self.bind_pipeline(config)
        self.history = history
        self.ledger = ledger
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

    def committable(self, handles: Handles | None) -> CommittableT | None:
        """The committable stored as a batch's handles (None when the batch recorded none)."""
        return self.committable_type.from_handles(handles) if handles else None

    def verify_staged(self, batch: Batch, committable: CommittableT) -> None:
        """Raise TransactionLostError if the staged output is gone, without committing anything.

        Lets a commit of several sinks (output and dead letters) find a loss before any of them
        becomes visible; a sink without a cheap check relies on its commit finding it.
        """

    @abstractmethod
    def commit(self, batch: Batch, committable: CommittableT) -> str:
        """Make the staged output visible. Idempotent. Raises TransactionLostError if it is gone."""

    @abstractmethod
    def abort(self, batch: Batch, committable: CommittableT | None) -> str:
        """Discard the staged output of `committable` (one attempt), or of every attempt of `batch` (None)."""

    def retract(self, batch: Batch, committable: CommittableT | None) -> str:
        """Remove the committed output of `batch` (a rewind, or replaced by a re-run). Idempotent."""
        raise ConfigurationError(
            f"the {self.name} sink cannot withdraw committed output: rewind with --output keep (the range is "
            "delivered again) or re-run intervals with interval_rerun='noop'")

    def commit_replacing(self, batch: Batch, committable: CommittableT, replaced: Batch) -> str:
        """Commit `batch` in place of the committed output of `replaced`. Idempotent.

        The default publishes first and withdraws the old output after, so a crash in
        between can show both for a moment but never loses data; sinks that can swap
        atomically override it.
        """
        outcome = self.commit(batch, committable)
        return f"{outcome}; {self.retract(replaced, self.committable(replaced.handles))}"
