"""Multipart uploads that a writer leaves open and a committer completes: S3's two-phase commit.

An object written as a multipart upload is invisible until CompleteMultipartUpload, and an open
upload survives its writer (Flink's FileSink publishes on S3 the same way). `UploadStream` is the
file a writer writes into: it hands a part to a sender thread each time `part_size` bytes are
buffered, so encoding the next part and uploading the last ones overlap (as S3A's block upload
does), and a file of any size is held in memory at most `1 + in_flight` parts at a time. `complete`
is idempotent: a completed upload is gone (NoSuchUpload), and its object with the expected size
means "done before" (`completion_outcome`).
"""

from __future__ import annotations

import io
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterable

from airflow_exactly_once.storage.s3_client import error_code

MIN_PART_BYTES = 5 * 1024 * 1024  # S3's least size of every part but the last
MAX_PARTS = 10_000
# What S3 answers for an upload id that is no longer open (completed or aborted). s3proxy answers NoSuchKey to a
# second CompleteMultipartUpload.
GONE_CODES = frozenset({"NoSuchUpload", "NoSuchKey", "404"})


@dataclass(frozen=True)
class OpenUpload:
    """One object staged as an open multipart upload: its parts, in order, with the ETags S3 gave them."""

    key: str
    upload_id: str
    parts: tuple[tuple[int, str], ...]
    bytes: int


class Completion(Enum):
    COMPLETED = "completed"  # this call published the object
    ALREADY = "already"  # an earlier call did
    LOST = "lost"  # the upload is gone and the object is not there whole: aborted, expired


def completion_outcome(gone: bool, found_bytes: int | None, expected_bytes: int) -> Completion:
    """What a completion attempt means. `gone`: S3 answered that the upload is not open; `found_bytes`: the size
    of the object at its key (None: no object). Only an object of exactly the staged size counts as done."""
    if not gone:
        return Completion.COMPLETED
    return Completion.ALREADY if found_bytes == expected_bytes else Completion.LOST


class UploadStream(io.RawIOBase):
    """A write-only file whose bytes become the parts of an open multipart upload (never completed here).

    Parts are sent by `in_flight` threads; a failed part is raised by the next `write` or by `staged`.
    """

    def __init__(self, client: Any, bucket: str, key: str, part_size: int, in_flight: int = 2) -> None:
        super().__init__()
        if part_size < MIN_PART_BYTES:
            raise ValueError(f"a part holds at least {MIN_PART_BYTES} bytes (S3's minimum), not {part_size}")
        self.client, self.bucket, self.key, self.part_size = client, bucket, key, part_size
        self.upload_id: str = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        self._buffer = bytearray()
        self._in_flight = max(1, in_flight)
        self._senders = ThreadPoolExecutor(self._in_flight, thread_name_prefix=f"upload-{key[-24:]}")
        self._sent: list[Future[tuple[int, str]]] = []
        self._written = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._written

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._buffer += view
        self._written += len(view)
        while len(self._buffer) >= self.part_size:
            self._send(bytes(self._buffer[:self.part_size]))
            del self._buffer[:self.part_size]
        return len(view)

    def staged(self) -> OpenUpload:
        """Send what is buffered as the last part, wait for every part; the upload stays open."""
        if self._buffer or not self._sent:
            self._send(bytes(self._buffer))
            self._buffer = bytearray()
        try:
            parts = tuple(sent.result() for sent in self._sent)
        finally:
            self._senders.shutdown(wait=True, cancel_futures=True)
        return OpenUpload(self.key, self.upload_id, parts, self._written)

    def abort(self) -> None:
        self._senders.shutdown(wait=True, cancel_futures=True)  # no part lands after the abort
        abort_upload(self.client, self.bucket, self.key, self.upload_id)

    def _send(self, body: bytes) -> None:
        number = len(self._sent) + 1
        if number > MAX_PARTS:
            raise ValueError(f"{self.key} needs more than {MAX_PARTS} parts: raise the part size")
        if len(self._sent) >= self._in_flight:
            self._sent[-self._in_flight].result()  # at most `in_flight` parts held beside the buffer; raises a failure
        self._sent.append(self._senders.submit(self._upload_part, number, body))

    def _upload_part(self, number: int, body: bytes) -> tuple[int, str]:
        answer = self.client.upload_part(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
                                         PartNumber=number, Body=body)
        return number, answer["ETag"]


def object_size(client: Any, bucket: str, key: str) -> int | None:
    """The size of the object at `key`, None when there is none."""
    try:
        return int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
    except Exception as exc:
        if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise


def complete(client: Any, bucket: str, upload: OpenUpload) -> Completion:
    """Publish `upload` (idempotent): the object appears whole, once."""
    try:
        client.complete_multipart_upload(
            Bucket=bucket, Key=upload.key, UploadId=upload.upload_id,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etag} for n, etag in upload.parts]})
        return Completion.COMPLETED
    except Exception as exc:
        if error_code(exc) not in GONE_CODES:
            raise
    return completion_outcome(True, object_size(client, bucket, upload.key), upload.bytes)


def is_open(client: Any, bucket: str, upload: OpenUpload) -> bool:
    """Whether the upload is still open (its parts kept, completion possible). Asked by listing the uploads of its
    key: ListParts of an aborted upload answers an empty list on some S3-compatible servers (s3proxy)."""
    return any(upload_id == upload.upload_id for _, upload_id in open_uploads(client, bucket, upload.key))


def abort_upload(client: Any, bucket: str, key: str, upload_id: str) -> bool:
    """Abort one upload; False when it was no longer open (idempotent)."""
    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        return True
    except Exception as exc:
        if error_code(exc) in GONE_CODES:
            return False
        raise


def open_uploads(client: Any, bucket: str, prefix: str) -> list[tuple[str, str]]:
    """(key, upload id) of every open upload under `prefix`, those of writers that never reported included."""
    found: list[tuple[str, str]] = []
    paginator = client.get_paginator("list_multipart_uploads")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        found += [(u["Key"], u["UploadId"]) for u in page.get("Uploads", [])]
    return found


def listed_keys(client: Any, bucket: str, prefix: str) -> list[str]:
    """The keys of the objects under `prefix`."""
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def delete_keys(client: Any, bucket: str, keys: Iterable[str]) -> int:
    """Delete objects one request each (a batch has a file per Spark partition): DeleteObjects needs a checksum
    header that S3-compatible servers do not all take. Deleting a missing key is no error. How many were asked.

    Deepest first: a store on a file system (s3proxy's filesystem backend) lists each folder as a key ending in `/`,
    and deleting such a key while the folder still holds files takes it 10 s; after them, no time."""
    keys = sorted(keys, reverse=True)
    for key in keys:
        client.delete_object(Bucket=bucket, Key=key)
    return len(keys)
