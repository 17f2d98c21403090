"""The sink side of the two-phase commit (Flink's TwoPhaseCommitSinkFunction).

`prepare` runs inside the write task and leaves output staged but invisible, returning
JSON handles; the driver stores them in the ledger when the batch becomes PREPARED.
`commit` and `abort` run later, often in another process, from those handles alone,
and must be idempotent because a crash can interrupt them at any point.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from airflow_exactly_once.core.model import Batch

Handles = dict[str, Any]


class Sink(ABC):
    """One sink type. Instances are built from a JSON spec, so they work after spark-submit."""

    type_name: str = ""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

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
