"""What the Kafka sink's writers report and what its committer works from.

One `PartitionReport` per Spark partition (the commit message): how many records it sent,
the first acknowledged offset per output partition (the evidence that decides "committed or
aborted" once the broker has forgotten a transaction), and, under EXACTLY_ONCE, the open
transaction's handle. `KafkaCommittable` is the batch's reports plus where they went and the
slot of its pooled transactional ids (None: ids named per batch) and the slot count they were named
with; its JSON form is the ledger's handles (format version 1: the first release's, now stamped;
`id_slot` and `id_slots` are optional keys that releases before pooling ignore, so they need no new
version).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_exactly_once.core.errors import SinkError
from airflow_exactly_once.core.sink import Committable, Handles
from airflow_exactly_once.sinks.kafka.transaction_handle import TransactionHandle

FirstOffset = tuple[str, int, int]  # output topic, partition, offset


@dataclass(frozen=True)
class PartitionReport:
    partition: int
    records: int
    first_offsets: tuple[FirstOffset, ...] = ()
    transaction: TransactionHandle | None = None

    @property
    def transactional_id(self) -> str | None:
        return None if self.transaction is None else self.transaction.transactional_id

    @property
    def held_transaction(self) -> TransactionHandle:
        """The transaction of a report that holds one (each of `KafkaCommittable.transactions`)."""
        if self.transaction is None:
            raise SinkError(f"the Kafka writer of partition {self.partition} reported no transaction: only reports "
                            "written under EXACTLY_ONCE hold one (KafkaCommittable.transactions)", retriable=False)
        return self.transaction

    def to_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "records": self.records,
                "first_offsets": [list(o) for o in self.first_offsets],
                "transaction": None if self.transaction is None else self.transaction.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PartitionReport":
        handle = data.get("transaction")
        return cls(int(data["partition"]), int(data.get("records", 0)),
                   tuple((str(t), int(p), int(o)) for t, p, o in data.get("first_offsets", ())),
                   None if handle is None else TransactionHandle.from_dict(handle))


@dataclass(frozen=True)
class KafkaCommittable(Committable):
    guarantee: str
    bootstrap_servers: str
    topic: str
    reports: tuple[PartitionReport, ...] = field(default=())
    id_slot: int | None = None
    id_slots: int | None = None  # the slot count the ids were named with (a later count is refused while open)

    @property
    def records(self) -> int:
        return sum(r.records for r in self.reports)

    @property
    def transactions(self) -> list[PartitionReport]:
        """The reports that hold a transaction (EXACTLY_ONCE)."""
        return [r for r in self.reports if r.transaction is not None]

    handles_version = 1

    def write_handles(self) -> Handles:
        handles: Handles = {"guarantee": self.guarantee, "bootstrap_servers": self.bootstrap_servers,
                            "topic": self.topic, "writers": [r.to_dict() for r in self.reports]}
        if self.id_slot is not None:
            handles["id_slot"] = self.id_slot
        if self.id_slots is not None:
            handles["id_slots"] = self.id_slots
        return handles

    @classmethod
    def read_handles_v1(cls, handles: Handles) -> "KafkaCommittable":
        return cls(str(handles.get("guarantee", "EXACTLY_ONCE")), str(handles.get("bootstrap_servers", "")),
                   str(handles.get("topic", "")),
                   tuple(sorted((PartitionReport.from_dict(w) for w in handles.get("writers", ())),
                                key=lambda r: r.partition)),
                   None if handles.get("id_slot") is None else int(handles["id_slot"]),
                   None if handles.get("id_slots") is None else int(handles["id_slots"]))
