"""Plain value types shared by the ledger, the planner, the sinks and the Spark job."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from airflow_exactly_once.core.states import BatchState

# The keys of a batch's details (a JSON object in the ledger) that the protocol reads, each through an accessor of
# Batch below; writers build them with the same names.
BAD_RECORDS = "bad_records"  # what the write counted of bad records (BadRecordsNote)
SKIPPED = "skipped"  # the plan's data_loss_policy="skip" notes, one sentence per partition
REPLACES = "replaces"  # the seq of the committed batch whose output this one replaces (an interval re-run)


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
class BadRecordsNote:
    """What a write counted of its bad records, kept with the batch: how many, under which bad_record_policy, of
    which kind, and where the first ones were (topic, partition, offset, error)."""

    count: int
    policy: str
    undecodable: int = 0
    marked_by_transform: int = 0
    first: tuple[Mapping[str, Any], ...] = ()

    def as_details(self) -> dict[str, Any]:
        return {"count": self.count, "undecodable": self.undecodable, "marked_by_transform": self.marked_by_transform,
                "policy": self.policy, "first": [dict(r) for r in self.first]}

    @classmethod
    def of_details(cls, value: Mapping[str, Any]) -> BadRecordsNote:
        return cls(int(value.get("count") or 0), str(value.get("policy") or "unknown"),
                   int(value.get("undecodable") or 0), int(value.get("marked_by_transform") or 0),
                   tuple(value.get("first") or ()))


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

    @property
    def bad_records(self) -> BadRecordsNote | None:
        """The write's bad records, None when it counted none."""
        value = self.details.get(BAD_RECORDS)
        return BadRecordsNote.of_details(value) if value else None

    @property
    def bad_record_count(self) -> int:
        note = self.bad_records
        return note.count if note is not None else 0

    @property
    def skipped(self) -> tuple[str, ...]:
        """What the plan skipped under data_loss_policy="skip", one sentence per partition."""
        return tuple(self.details.get(SKIPPED) or ())

    @property
    def replaces(self) -> int | None:
        """The seq of the committed batch whose output this one replaces (a re-run of a data interval), or None."""
        seq = self.details.get(REPLACES)
        return None if seq is None else int(seq)

    def describe(self) -> str:
        parts = ", ".join(f"{r.topic}[{r.partition}] {r.start}..{r.end}" for r in self.ranges if r.size)
        return f"batch {self.id} ({self.state.value}, epoch {self.epoch}): {parts or 'no new offsets'}"


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
