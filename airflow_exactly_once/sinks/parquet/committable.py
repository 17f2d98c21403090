"""The Parquet sink's committable: one write attempt's staged folder."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_exactly_once.core.sink import Committable, Handles


@dataclass(frozen=True)
class StagedFolder(Committable):
    """One write attempt's files: where they are staged and where they get published."""

    staging: str
    final: str
    files: tuple[str, ...] = ()

    handles_version = 1

    def write_handles(self) -> Handles:
        return {"staging": self.staging, "final": self.final, "files": list(self.files)}

    @classmethod
    def read_handles_v1(cls, handles: Handles) -> "StagedFolder":
        return cls(str(handles["staging"]), str(handles["final"]), tuple(handles.get("files", ())))
