"""The committable of a Delta batch: one write attempt's staged files inside the table's folder, each with what
its add action needs (so the commit reads no file of the batch, footers included)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_exactly_once.core.sink import Committable, Handles


@dataclass(frozen=True)
class StagedFile:
    """One staged Parquet file, as the writer that staged it saw it."""

    path: str  # relative to the table's folder
    size: int  # bytes
    rows: int
    stats: str  # Delta's stats JSON (sinks.delta.stats.file_stats)
    partition_values: tuple[tuple[str, str | None], ...]  # Delta's partition values, by column
    modified_ms: int

    def to_handle(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "rows": self.rows, "stats": self.stats,
                "partition_values": [[c, v] for c, v in self.partition_values], "modified_ms": self.modified_ms}

    @classmethod
    def of_handle(cls, handle: dict[str, Any]) -> "StagedFile":
        values = tuple((str(c), None if v is None else str(v)) for c, v in handle["partition_values"])
        return cls(str(handle["path"]), int(handle["size"]), int(handle["rows"]), str(handle["stats"]), values,
                   int(handle["modified_ms"]))


@dataclass(frozen=True)
class StagedFiles(Committable):
    """A write attempt's Parquet files, as paths relative to the table's folder (none: the attempt had no rows).

    `entries` describe each file (handles version 2); a committable of version 1 lists the paths only, and its commit
    reads their footers."""

    table: str  # the table's folder
    folder: str  # the attempt's staging folder, relative to the table's folder
    files: tuple[str, ...] = ()
    staged_records: int | None = field(default=None, compare=False)  # from the footers (not in the handles)
    entries: tuple[StagedFile, ...] = ()

    handles_version = 2

    @classmethod
    def described(cls, table: str, folder: str, entries: list[StagedFile]) -> "StagedFiles":
        ordered = tuple(sorted(entries, key=lambda e: e.path))
        return cls(table, folder, tuple(e.path for e in ordered), sum(e.rows for e in ordered), ordered)

    @property
    def records(self) -> int | None:
        return self.staged_records

    def write_handles(self) -> Handles:
        return {"table": self.table, "folder": self.folder, "files": list(self.files),
                "entries": [e.to_handle() for e in self.entries]}

    @classmethod
    def read_handles_v1(cls, handles: Handles) -> "StagedFiles":
        return cls(str(handles["table"]), str(handles["folder"]), tuple(str(f) for f in handles.get("files", ())))

    @classmethod
    def read_handles_v2(cls, handles: Handles) -> "StagedFiles":
        entries = [StagedFile.of_handle(f) for f in handles.get("entries", ())]
        if entries:
            return cls.described(str(handles["table"]), str(handles["folder"]), entries)
        return cls.read_handles_v1(handles)  # a version-1 committable written again: paths only
