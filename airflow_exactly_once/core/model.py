"""Plain value types shared by the ledger, the planner, the sinks and the Spark job."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from airflow_exactly_once.core.states import BatchState


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets [start, end) of one partition; end is exclusive, as in Kafka."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start

    def as_dict(self) -> dict[str, Any]:
        """As Asset events, lineage facets, the CLI's and the ledger page's JSON show a range."""
        return {"topic": self.topic, "partition": self.partition, "start": self.start, "end": self.end}


@dataclass(frozen=True)
class BatchId:
    """What XCom carries between the tasks: the pipeline and the batch number."""

    pipeline_id: str
    seq: int

    def __str__(self) -> str:
        return f"{self.pipeline_id}:{self.seq}"

    @classmethod
    def parse(cls, text: str) -> "BatchId":
        pipeline_id, _, seq = str(text).rpartition(":")
        if not pipeline_id or not seq.isdigit():
            raise ValueError(f"not a batch id: {text!r} (expected '<pipeline_id>:<batch_seq>')")
        return cls(pipeline_id, int(seq))


@dataclass(frozen=True)
class Batch:
    pipeline_id: str
    seq: int
    run_id: str
    state: BatchState
    epoch: int
    ranges: tuple[OffsetRange, ...]
    handles: dict[str, Any] | None = None
    input_records: int | None = None
    output_records: int | None = None
    error: str | None = None
    created_at: Any = None
    updated_at: Any = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> BatchId:
        return BatchId(self.pipeline_id, self.seq)

    @property
    def offset_span(self) -> int:
        """Offsets covered; an upper bound of the records (transaction markers take offsets too)."""
        return sum(r.size for r in self.ranges)

    @property
    def is_empty(self) -> bool:
        return self.offset_span == 0

    def describe(self) -> str:
        parts = ", ".join(f"{r.topic}[{r.partition}] {r.start}..{r.end}" for r in self.ranges if r.size)
        return f"batch {self.id} ({self.state.value}, epoch {self.epoch}): {parts or 'no new offsets'}"


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
