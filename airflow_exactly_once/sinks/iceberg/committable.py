"""The committable of an Iceberg batch: the staged snapshot of one write attempt."""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_exactly_once.core.sink import Committable, Handles


# [START committable]
@dataclass(frozen=True)
class StagedSnapshot(Committable):
    """A write attempt's staged snapshot (None: the attempt had no rows, so Spark staged nothing)."""

    table: str  # namespace.name in the catalog
    wap_id: str
    snapshot_id: int | None
    records: int | None = field(default=None, compare=False)  # the snapshot's added-records (not in the handles)

    handles_version = 1

    def write_handles(self) -> Handles:
        return {"table": self.table, "wap_id": self.wap_id, "snapshot_id": self.snapshot_id}

    @classmethod
    def read_handles_v1(cls, handles: Handles) -> "StagedSnapshot":
        snapshot = handles.get("snapshot_id")
        return cls(str(handles["table"]), str(handles["wap_id"]), None if snapshot is None else int(snapshot))
# [END committable]
