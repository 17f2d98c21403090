"""The sink side of the two-phase commit (Flink's TwoPhaseCommitSinkFunction).

`prepare` runs inside the write task and leaves output staged but invisible, returning
JSON handles; the driver stores them in the ledger when the batch becomes PREPARED.
`commit` and `abort` run later, often in another process, from those handles alone,
and must be idempotent because a crash can interrupt them at any point.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.model import Batch

if TYPE_CHECKING:
    from airflow_exactly_once.core.config import PipelineConfig

Handles = dict[str, Any]


class Sink(ABC):
    """One sink type. Instances are built from a JSON spec, so they work after spark-submit."""

    type_name: str = ""
    # The `guarantee=` levels this sink implements; staged-and-published sinks only have one.
    guarantees: tuple[str, ...] = ("EXACTLY_ONCE",)
    # Whether committed output can be withdrawn again (rewinds, interval replacement).
    supports_retract: bool = False

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.pipeline: "PipelineConfig | None" = None

    def bind(self, config: "PipelineConfig") -> "Sink":
        """Give the sink the pipeline settings it may share (servers, client settings, guarantee)."""
        if config.guarantee not in self.guarantees:
            raise ConfigurationError(
                f"the {self.type_name or type(self).__name__} sink does not implement guarantee="
                f"{config.guarantee!r}; choose one of {', '.join(self.guarantees)}")
        self.pipeline = config
        return self

    def commit_deadline_ms(self) -> int | None:
        """How long pre-committed output survives before the sink discards it; None: until aborted.

        The plan task checks the DAG's retry settings against it (a commit that comes later
        finds the output gone and the batch is processed again).
        """
        return None

    def check(self, pipeline_id: str) -> None:
        """Plan-time validation against the real system (permissions, server settings)."""

    @abstractmethod
    def prepare(self, data: Any, batch: Batch, attempt: str) -> Handles:
        """Write `data` (a Spark DataFrame) staged and invisible; return commit handles.

        On failure it removes what this attempt staged before raising.
        """

    @abstractmethod
    def commit(self, batch: Batch, handles: Handles) -> str:
        """Make the staged output visible. Idempotent. Raises TransactionLostError if it is gone."""

    @abstractmethod
    def abort(self, batch: Batch, handles: Handles | None) -> str:
        """Discard staged output of every attempt of `batch`. Idempotent."""

    def count_output(self, handles: Handles) -> int | None:
        """Records staged, if the sink can tell cheaply."""
        return handles.get("records")

    # -- withdrawing committed output (optional) ------------------------------------

    def retract(self, batch: Batch, handles: Handles | None) -> str:
        """Remove the committed output of `batch` (a rewind, or replaced by a re-run). Idempotent."""
        raise ConfigurationError(
            f"the {self.type_name or type(self).__name__} sink cannot withdraw committed output: rewind with "
            "--output keep (the range is delivered again) or re-run intervals with interval_rerun='noop'")

    def commit_replacing(self, batch: Batch, handles: Handles, replaced: Batch) -> str:
        """Commit `batch` in place of the committed output of `replaced`. Idempotent.

        The default publishes first and withdraws the old output after, so a crash in
        between can show both for a moment but never loses data; sinks that can swap
        atomically should override it.
        """
        outcome = self.commit(batch, handles)
        return f"{outcome}; {self.retract(replaced, replaced.handles)}"
