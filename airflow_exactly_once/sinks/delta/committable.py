"""The committable of a Delta batch: one write attempt's staged files inside the table's folder."""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_exactly_once.core.sink import Committable, Handles


@dataclass(frozen=True)
class StagedFiles(Committable):
    """A write attempt's Parquet files, as paths relative to the table's folder (none: the attempt had no rows)."""

    table: str  # the table's folder
    folder: str  # the attempt's staging folder, relative to the table's folder
    files: tuple[str, ...] = ()
    staged_records: int | None = field(default=None, compare=False)  # from the footers (not in the handles)

    handles_version = 1

    @property
    def records(self) -> int | None:
        return self.staged_records

    def write_handles(self) -> Handles:
        return {"table": self.table, "folder": self.folder, "files": list(self.files)}

    @classmethod
    def read_handles_v1(cls, handles: Handles) -> "StagedFiles":
        return cls(str(handles["table"]), str(handles["folder"]), tuple(str(f) for f in handles.get("files", ())))
