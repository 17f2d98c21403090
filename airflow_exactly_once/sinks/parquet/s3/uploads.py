"""A batch's uploads and objects in the sink's bucket: what the writer cleans up after itself and the committer
completes, aborts, lists and deletes (the protocol's steps, in sinks.parquet.s3.sink_committer)."""

from __future__ import annotations

import json
from typing import Any

from airflow_exactly_once.sinks.storage_bucket import SinkBucket
from airflow_exactly_once.sinks.parquet.s3.committable import StagedFile
from airflow_exactly_once.sinks.parquet.s3.layout import ObjectLayout
from airflow_exactly_once.storage import multipart
from airflow_exactly_once.storage.multipart import Completion


class BatchUploads:
    def __init__(self, bucket: SinkBucket, layout: ObjectLayout) -> None:
        self.bucket, self.layout = bucket, layout

    def is_staged(self, file: StagedFile) -> bool:
        """Whether `file` can still be published: its upload is open, or it was published whole already."""
        name = self.bucket.name
        return self.bucket.call(f"checking the staged upload of {file.key}", lambda c: multipart.is_open(
            c, name, file.upload) or multipart.object_size(c, name, file.key) == file.bytes)

    def complete(self, file: StagedFile) -> Completion:
        return self.bucket.call(f"completing the upload of {file.key}",
                                lambda c: multipart.complete(c, self.bucket.name, file.upload))

    def abort(self, files: tuple[StagedFile, ...]) -> int:
        """Abort the uploads of `files`; how many were still open."""
        return sum(self._abort_one(f.key, f.upload_id) for f in files)

    def abort_open(self, seq: int, epoch: int | None = None) -> int:
        """Abort every open upload of batch `seq` (of the attempt `epoch` only, if given), those of writers that
        never reported (killed, fenced) included; how many."""
        folder = self.layout.batch_folder(seq)
        found = self.bucket.call(f"listing the open uploads under {folder}",
                                 lambda c: multipart.open_uploads(c, self.bucket.name, folder))
        mine = [(key, upload_id) for key, upload_id in found
                if epoch is None or self.layout.attempt_of(key) == epoch]
        for key, upload_id in mine:
            self._abort_one(key, upload_id)
        return len(mine)

    def _abort_one(self, key: str, upload_id: str) -> bool:
        return self.bucket.call(f"aborting the upload of {key}",
                                lambda c: multipart.abort_upload(c, self.bucket.name, key, upload_id))

    def objects(self, seq: int) -> list[str]:
        folder = self.layout.batch_folder(seq)
        return self.bucket.call(f"listing {folder}", lambda c: multipart.listed_keys(c, self.bucket.name, folder))

    def delete(self, keys: list[str]) -> int:
        return self.bucket.call(f"deleting {len(keys)} object(s)",
                                lambda c: multipart.delete_keys(c, self.bucket.name, keys)) if keys else 0

    def published(self, seq: int) -> bool:
        """Whether batch `seq`'s manifest entry exists: the batch is complete exactly then."""
        key = self.layout.manifest_key(seq)
        return self.bucket.call(f"reading {key}",
                                lambda c: multipart.object_size(c, self.bucket.name, key)) is not None

    def put_manifest(self, seq: int, entry: dict[str, Any]) -> None:
        key = self.layout.manifest_key(seq)
        body = json.dumps(entry, indent=1, default=str).encode()
        self.bucket.call(f"writing {key}", lambda c: c.put_object(Bucket=self.bucket.name, Key=key, Body=body,
                                                                  ContentType="application/json"))

    def remove_manifest(self, seq: int) -> None:
        key = self.layout.manifest_key(seq)
        self.bucket.call(f"deleting {key}", lambda c: c.delete_object(Bucket=self.bucket.name, Key=key))

    def owner(self) -> str | None:
        """The pipeline id in the prefix's `_pipeline` object, None when there is none."""
        key = self.layout.owner_key
        if self.bucket.call(f"reading {key}", lambda c: multipart.object_size(c, self.bucket.name, key)) is None:
            return None
        return self.bucket.call(f"reading {key}", lambda c: c.get_object(
            Bucket=self.bucket.name, Key=key)["Body"].read().decode().strip())

    def claim_owner(self, pipeline_id: str) -> None:
        key = self.layout.owner_key
        self.bucket.call(f"writing {key}", lambda c: c.put_object(Bucket=self.bucket.name, Key=key,
                                                                  Body=pipeline_id.encode()))

    def check_bucket(self) -> None:
        """The bucket exists and the credentials may use it (a named error otherwise)."""
        self.bucket.call(f"opening bucket {self.bucket.name!r}", lambda c: c.head_bucket(Bucket=self.bucket.name))
