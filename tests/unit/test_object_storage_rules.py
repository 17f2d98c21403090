"""The pure parts of object storage: locations, the idempotent completion decision, the S3 committable's handles."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.storage.object_location import ObjectLocation, is_object_storage, parse_object_location
from airflow_exactly_once.sinks import spec_local_folders
from airflow_exactly_once.sinks.parquet.s3.committable import StagedFile, StagedUploads
from airflow_exactly_once.sinks.parquet.s3.layout import ObjectLayout
from airflow_exactly_once.sinks.parquet.spec import ParquetSpec
from airflow_exactly_once.storage.multipart import (MIN_PART_BYTES, Completion, UploadStream, completion_outcome,
                                                  delete_keys)
from airflow_exactly_once.storage.s3_client import S3Access

FIXTURE = Path(__file__).parents[1] / "fixtures" / "handles" / "parquet-s3-v1.json"


@pytest.mark.parametrize("path,expected", [
    ("s3://lake/orders", ObjectLocation("s3", "lake", "orders")),
    ("s3a://lake/a/b/", ObjectLocation("s3a", "lake", "a/b")),
    ("S3://lake", ObjectLocation("s3", "lake", "")),
])
def test_a_location_is_scheme_bucket_and_prefix(path, expected):
    assert parse_object_location(path, "path") == expected


@pytest.mark.parametrize("path", ["gs://b/p", "abfss://c@a.dfs.core.windows.net/p", "hdfs://nn/p", "/data/out"])
def test_other_schemes_are_refused_naming_the_supported_ones(path):
    with pytest.raises(ConfigurationError, match="supported: s3://, s3a://"):
        parse_object_location(path, "the parquet sink's path")


def test_a_location_without_a_bucket_is_refused():
    with pytest.raises(ConfigurationError, match="names no bucket"):
        parse_object_location("s3:///orders", "path")


def test_local_paths_are_not_object_storage():
    assert not is_object_storage("/data/out") and not is_object_storage("file:///data/out")
    assert is_object_storage("s3://b/p") and is_object_storage("gs://b/p")


def test_keys_are_unique_per_attempt_and_listed_relative_to_the_path():
    layout = ObjectLayout(ObjectLocation("s3", "lake", "orders"))
    assert layout.file_key(7, 2, 3) == "orders/batch_seq=7/part-00002-e3.parquet"
    assert layout.file_key(7, 2, 4) != layout.file_key(7, 2, 3)
    assert layout.batch_folder(7) == "orders/batch_seq=7/"  # not batch_seq=70
    assert layout.manifest_key(7) == "orders/_manifest/batch-000000007.json"
    assert layout.relative("orders/batch_seq=7/part-00002-e3.parquet") == "batch_seq=7/part-00002-e3.parquet"
    assert layout.attempt_of("orders/batch_seq=7/part-00002-e3.parquet") == 3
    assert ObjectLayout(ObjectLocation("s3", "lake", "")).batch_folder(1) == "batch_seq=1/"


@pytest.mark.parametrize("gone,found,expected", [
    (False, None, Completion.COMPLETED),  # the server completed it now
    (True, 1234, Completion.ALREADY),  # completed by an earlier (crashed) commit
    (True, None, Completion.LOST),  # aborted or expired, never completed
    (True, 1000, Completion.LOST),  # another object at the key: not ours, not whole
])
def test_completion_is_idempotent_only_for_an_object_of_the_staged_size(gone, found, expected):
    assert completion_outcome(gone, found, 1234) is expected


def test_the_s3_committable_reads_the_handles_of_its_first_format():
    read = StagedUploads.from_handles(json.loads(FIXTURE.read_text()))
    assert read == StagedUploads("lake", "orders/batch_seq=7/", 2, (
        StagedFile("orders/batch_seq=7/part-00000-e2.parquet", "upload-a", ((1, '"etag-a1"'), (2, '"etag-a2"')),
                   7, 6291556),
        StagedFile("orders/batch_seq=7/part-00001-e2.parquet", "upload-b", ((1, '"etag-b1"'),), 5, 2210)))
    assert read.records == 12
    assert StagedUploads.from_handles(read.to_handles()) == read


def test_an_s3_path_is_safe_on_several_workers_and_a_local_one_is_not():
    assert spec_local_folders({"type": "parquet", "path": "s3://lake/orders"}) == []
    assert [v for _, v, _ in spec_local_folders({"type": "parquet", "path": "/data/out"})] == ["/data/out"]


def test_the_spec_refuses_an_unsupported_scheme_and_part_size_when_parsed():
    with pytest.raises(ConfigurationError, match="gs:// is not supported"):
        ParquetSpec.check_before_rendering({"type": "parquet", "path": "gs://lake/orders"})
    with pytest.raises(ConfigurationError, match="part_size_mb must be 5 to 5120"):
        ParquetSpec.check({"type": "parquet", "path": "s3://lake/orders", "part_size_mb": 4})
    ParquetSpec.check_before_rendering({"type": "parquet", "path": "{{ var.value.out }}"})  # checked when rendered


def test_s3_access_shows_no_key():
    access = S3Access("http://127.0.0.1:9", "us-east-1", "AKIDSHOWN", "the-secret-key", "the-token")
    assert "the-secret-key" not in repr(access) and "the-token" not in repr(access)


class _PartRecorder:
    """A fake S3 client for UploadStream: records parts, how many were in flight at once, fails a part if told."""

    def __init__(self, fail_part: int | None = None) -> None:
        self.parts: dict[int, int] = {}
        self.in_flight = self.most_in_flight = 0
        self.fail_part = fail_part
        self.aborted = False
        self._lock = threading.Lock()

    def create_multipart_upload(self, Bucket, Key):
        return {"UploadId": "u1"}

    def upload_part(self, Bucket, Key, UploadId, PartNumber, Body):
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(0.02)
        with self._lock:
            self.in_flight -= 1
        if PartNumber == self.fail_part:
            raise OSError("connection reset")
        self.parts[PartNumber] = len(Body)
        return {"ETag": f"e{PartNumber}"}

    def abort_multipart_upload(self, Bucket, Key, UploadId):
        self.aborted = True


def test_an_upload_stream_sends_parts_in_order_overlapped_and_bounded():
    client = _PartRecorder()
    stream = UploadStream(client, "b", "k", MIN_PART_BYTES, in_flight=2)
    for _ in range(9):
        stream.write(b"x" * (MIN_PART_BYTES // 2 + 1))
    staged = stream.staged()
    assert [n for n, _ in staged.parts] == list(range(1, 6))
    assert [etag for _, etag in staged.parts] == [f"e{n}" for n in range(1, 6)]
    assert sum(client.parts.values()) == staged.bytes == 9 * (MIN_PART_BYTES // 2 + 1)
    assert all(size == MIN_PART_BYTES for n, size in client.parts.items() if n < 5)
    assert client.most_in_flight == 2  # overlapped, and never more than asked


def test_a_failed_part_is_raised_and_abort_leaves_nothing_in_flight():
    client = _PartRecorder(fail_part=1)
    stream = UploadStream(client, "b", "k", MIN_PART_BYTES, in_flight=1)
    with pytest.raises(OSError, match="connection reset"):
        for _ in range(4):
            stream.write(b"x" * MIN_PART_BYTES)
        stream.staged()
    stream.abort()
    assert client.aborted and client.in_flight == 0 and 1 not in client.parts


def test_keys_are_deleted_deepest_first_so_a_folder_key_follows_what_it_holds():
    """s3proxy's filesystem store lists folders as keys ending in `/` and takes 10 s to delete one that still holds
    files (a Delta commit sweeping three withdrawn folders took a minute)."""
    deleted: list[str] = []

    class Client:
        def delete_object(self, Bucket: str, Key: str) -> None:
            deleted.append(Key)

    keys = ["t/b1/part=a/", "t/b1/part=a/f1.parquet", "t/b1/f0.parquet", "t/b1/part=b/", "t/b1/part=b/f2.parquet"]
    assert delete_keys(Client(), "lake", keys) == 5
    for folder in ("t/b1/part=a/", "t/b1/part=b/"):
        assert all(deleted.index(k) < deleted.index(folder) for k in keys if k.startswith(folder) and k != folder)
