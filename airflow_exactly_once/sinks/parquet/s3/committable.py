"""The Parquet sink's committable on object storage: one write attempt's files, each an open multipart upload."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_exactly_once.core.sink import Committable, Handles
from airflow_exactly_once.storage.multipart import OpenUpload


@dataclass(frozen=True)
class StagedFile:
    """One Spark partition's Parquet file: its upload (key, id, parts with ETags) and what it holds."""

    key: str
    upload_id: str
    parts: tuple[tuple[int, str], ...]
    rows: int
    bytes: int

    @classmethod
    def of(cls, upload: OpenUpload, rows: int) -> "StagedFile":
        return cls(upload.key, upload.upload_id, upload.parts, rows, upload.bytes)

    @property
    def upload(self) -> OpenUpload:
        return OpenUpload(self.key, self.upload_id, self.parts, self.bytes)


@dataclass(frozen=True)
class StagedUploads(Committable):
    """A write attempt's staged files in `bucket`, under the batch's folder `folder`."""

    bucket: str
    folder: str
    epoch: int
    files: tuple[StagedFile, ...] = ()

    handles_version = 1

    @property
    def records(self) -> int | None:
        return sum(f.rows for f in self.files)

    def write_handles(self) -> Handles:
        return {"bucket": self.bucket, "folder": self.folder, "epoch": self.epoch,
                "files": [{"key": f.key, "upload_id": f.upload_id, "parts": [[n, etag] for n, etag in f.parts],
                           "rows": f.rows, "bytes": f.bytes} for f in self.files]}

    @classmethod
    def read_handles_v1(cls, handles: Handles) -> "StagedUploads":
        files = tuple(StagedFile(str(f["key"]), str(f["upload_id"]),
                                 tuple((int(n), str(etag)) for n, etag in f["parts"]), int(f["rows"]), int(f["bytes"]))
                      for f in handles.get("files", ()))
        return cls(str(handles["bucket"]), str(handles["folder"]), int(handles["epoch"]), files)
