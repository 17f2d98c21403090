"""Where the Parquet sink keeps what under an object-storage path (s3://bucket/prefix):

  batch_seq=<n>/part-<partition>-e<epoch>.parquet   a file of batch n, written by the write attempt of that
                                                    epoch; an open multipart upload (invisible) until commit
  _manifest/batch-<n>.json                          written last, in one PUT: batch n is complete when it exists
  _pipeline                                         the pipeline that owns the prefix

No staging folder and no rename (S3 has none): a file's key is final from the start, unique per attempt,
and only its upload's completion makes it appear.
"""

from __future__ import annotations

import re

from airflow_exactly_once.storage.object_location import ObjectLocation

_ATTEMPT = re.compile(r"-e(\d+)\.parquet$")


class ObjectLayout:
    """The keys of one Parquet sink spec on object storage."""

    def __init__(self, location: ObjectLocation) -> None:
        self.location = location

    def batch_folder(self, seq: int) -> str:
        """The key prefix of batch `seq`'s files (ends with a slash: lists that folder only)."""
        return self.location.folder(f"batch_seq={seq}")

    def file_key(self, seq: int, partition: int, epoch: int) -> str:
        return f"{self.batch_folder(seq)}part-{partition:05d}-e{epoch}.parquet"

    def manifest_key(self, seq: int) -> str:
        return self.location.key("_manifest", f"batch-{seq:09d}.json")

    @property
    def owner_key(self) -> str:
        return self.location.key("_pipeline")

    def relative(self, key: str) -> str:
        """`key` below the sink's path, as the manifest lists it ("batch_seq=7/part-00000-e2.parquet")."""
        root = self.location.folder()
        return key[len(root):] if root and key.startswith(root) else key

    @staticmethod
    def attempt_of(key: str) -> int | None:
        """The epoch of the write attempt that wrote `key`, None for a key of no attempt."""
        match = _ATTEMPT.search(key)
        return int(match.group(1)) if match else None
