"""The handle of a pre-committed Kafka transaction: what ending it needs, storable as JSON.

Phase 1 of the Kafka sink's two-phase commit (the writers' librdkafka producers, librdkafka.py, or
kafka_python_producer.py) leaves a transaction open and returns its `TransactionHandle`; the batch's
committable keeps it in the ledger (committable.py), and phase 2 (end_txn.py) ends the transaction
from it, possibly in another process on another machine. A module of its own, importing nothing, so
that the writers, the committable and the committer share it without pulling in each other's clients.

No Airflow or PySpark imports: the writers on the Spark executors use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["TransactionHandle"]


@dataclass(frozen=True)
class TransactionHandle:
    """What phase 2 needs to finish a pre-committed transaction; JSON-serialisable.

    `partitions` are the (topic, partition) pairs the broker accepted into the
    transaction. `started` is False when nothing was written (no partitions or
    offsets added): the broker then has no transaction to end, and commit and
    abort are no-ops.
    """

    transactional_id: str
    producer_id: int
    epoch: int
    partitions: tuple[tuple[str, int], ...] = field(default=())
    started: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "epoch": self.epoch,
            "partitions": [[topic, partition] for topic, partition in self.partitions],
            "started": self.started,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TransactionHandle":
        try:
            return cls(
                transactional_id=str(data["transactional_id"]),
                producer_id=int(data["producer_id"]),
                epoch=int(data["epoch"]),
                partitions=tuple((str(t), int(p)) for t, p in data.get("partitions", ())),
                started=bool(data.get("started", True)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"Not a Kafka TransactionHandle dict: {data!r} ({exc})") from exc
