"""What the PostgreSQL sink's writers report and what its committer works from.

A partition's commit message is the GID of the transaction it prepared (plus its row
count); the batch's committable is those GIDs, the table and the write attempt's epoch.
Its JSON form is the ledger's handles (format version 1: the first release's, now stamped).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_exactly_once.core.sink import Committable, Handles


@dataclass(frozen=True)
class PreparedPartition:
    """One Spark partition's prepared transaction."""

    gid: str
    partition: int
    rows: int


@dataclass(frozen=True)
class PostgresCommittable(Committable):
    table: str
    mode: str
    epoch: int
    gids: tuple[str, ...] = field(default=())
    rows_written: int = 0

    @classmethod
    def of(cls, table: str, mode: str, epoch: int, parts: list[PreparedPartition]) -> "PostgresCommittable":
        parts = sorted(parts, key=lambda p: p.partition)
        return cls(table, mode, epoch, tuple(p.gid for p in parts), sum(p.rows for p in parts))

    handles_version = 1

    def write_handles(self) -> Handles:
        return {"table": self.table, "mode": self.mode, "epoch": self.epoch, "gids": list(self.gids),
                "rows_written": self.rows_written}

    @classmethod
    def read_handles_v1(cls, handles: Handles) -> "PostgresCommittable":
        return cls(str(handles.get("table", "")), str(handles.get("mode", "insert")), int(handles.get("epoch", 0)),
                   tuple(handles.get("gids", ())), int(handles.get("rows_written", 0)))
