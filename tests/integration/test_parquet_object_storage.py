"""The Parquet sink on object storage: real Spark writes to this worker's S3-compatible server (s3proxy), the
committer completes the uploads and writes the manifest entry; crashes are real processes killed at a named point.

A reader that lists the folder sees a file once its upload completes; a reader that follows `_manifest/` sees a
batch once its entry exists. Each test checks both views against the exact input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from airflow_exactly_once.core.errors import ConfigurationError, FencedError, SinkError
from airflow_exactly_once.core.faults import ENV as FAULTS_ENV
from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.sinks import create_committer
from airflow_exactly_once.spark.partition_writers import run_partition_writers
from airflow_exactly_once.storage.errors import BucketNotFoundError, StorageCredentialsError, StorageUnreachableError
from devtools.ports import reserve_port
from tests.harness import FakeSource, Pipe, open_ledger, pipeline_config
from tests.helpers import assert_exactly_once, read_s3_parquet, s3_open_uploads

ROOT = Path(__file__).resolve().parents[2]
RANGE = [OffsetRange("in", 0, 0, 12)]


@pytest.fixture
def lake(object_storage, monkeypatch):
    """A fresh bucket and an `aws` connection to it."""
    name = uuid.uuid4().hex[:8]
    monkeypatch.setenv(f"AIRFLOW_CONN_LAKE_{name.upper()}", json.dumps(object_storage.connection()))
    return object_storage.create_bucket(f"lake-{name}"), f"lake_{name}"


def make_pipe(tmp_path: Path, lake, **spec_extra) -> Pipe:
    bucket, conn_id = lake
    spec = {"type": "parquet", "path": f"s3://{bucket}/orders", "aws_conn_id": conn_id, **spec_extra}
    config = pipeline_config(f"s3-{uuid.uuid4().hex[:8]}", ["in"], spec)
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: FakeSource({("in", 0): 100}),
                run_writers=run_partition_writers)
    pipe.sink.check(config.pipeline_id)
    return pipe


def frame_of(spark, prefix: str, n: int = 12, partitions: int = 3):
    values = [f"{prefix}-{i}" for i in range(n)]
    return spark.createDataFrame([(v, v) for v in values], "key STRING, value STRING").repartition(partitions), values


def listed(client, bucket: str) -> list[dict]:
    return read_s3_parquet(client, bucket, "orders/")


def manifest_rows(client, bucket: str) -> list[dict]:
    """What a reader that follows `_manifest/` sees: the files each entry lists, nothing else."""
    import io

    import pyarrow.parquet as pq

    rows: list[dict] = []
    for item in client.list_objects_v2(Bucket=bucket, Prefix="orders/_manifest/").get("Contents", []):
        entry = json.loads(client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())
        for name in entry["files"]:
            body = client.get_object(Bucket=bucket, Key=f"orders/{name}")["Body"].read()
            rows += pq.read_table(io.BytesIO(body)).to_pylist()
    return rows


def batch_objects(client, bucket: str) -> list[str]:
    """The files under the batch folders (a "folder/" marker, which s3proxy's filesystem store lists as real S3 lists
    one a console made, is not a file: readers skip it)."""
    return [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="orders/batch_seq=").get("Contents", [])
            if not o["Key"].endswith("/")]


def written(spark, tmp_path: Path, lake, prefix: str):
    """A PREPARED batch of 12 values from three Spark partitions: (pipe, the batch, the values)."""
    pipe = make_pipe(tmp_path, lake)
    frame, values = frame_of(spark, prefix)
    return pipe, pipe.write(pipe.planted_batch("run-1", RANGE).id, frame), values


def test_a_batch_is_invisible_until_commit_then_exact_and_listed_in_its_manifest(spark, object_storage, lake,
                                                                                  tmp_path):
    bucket, client = lake[0], object_storage.client()
    pipe, prepared, values = written(spark, tmp_path, lake, "a")
    staged = pipe.sink.committable(prepared.handles)
    assert len(staged.files) == 3 and sum(f.rows for f in staged.files) == 12
    assert batch_objects(client, bucket) == [] and manifest_rows(client, bucket) == []  # nothing before commit
    assert len(s3_open_uploads(client, bucket, "orders/")) == 3

    pipe.commit(prepared.id)
    assert sorted(r["value"] for r in listed(client, bucket)) == sorted(values)
    assert sorted(r["value"] for r in manifest_rows(client, bucket)) == sorted(values)
    entry = json.loads(client.get_object(Bucket=bucket, Key="orders/_manifest/batch-000000001.json")["Body"].read())
    assert entry["files"] == [f.key.removeprefix("orders/") for f in staged.files]
    assert s3_open_uploads(client, bucket, "orders/") == []
    # A replay (notify_complete again, recovery, the committer below the ledger) publishes nothing twice.
    assert "already" in pipe.commit(prepared.id)
    assert "already" in pipe.new_coordinator().sink.commit(prepared, staged)
    assert_exactly_once(values, [r["value"] for r in listed(client, bucket)])


def test_a_partition_larger_than_a_part_is_uploaded_in_parts(spark, object_storage, lake, tmp_path):
    bucket, client = lake[0], object_storage.client()
    pipe = make_pipe(tmp_path, lake, part_size_mb=5)
    values = [f"{i:06d}-" + os.urandom(4000).hex() for i in range(1600)]  # ~12.8 MB of text that does not compress
    frame = spark.createDataFrame([(v[:6], v) for v in values], "key STRING, value STRING").coalesce(1)
    prepared = pipe.write(pipe.planted_batch("run-1", RANGE).id, frame)
    (staged,) = pipe.sink.committable(prepared.handles).files
    assert len(staged.parts) == 3 and staged.bytes > 10 * 1024 * 1024
    pipe.commit(prepared.id)
    assert sorted(r["value"] for r in listed(client, bucket)) == sorted(values)


COMMIT_IN_A_PROCESS = """
import json, sys
from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.model import BatchId
from tests.harness import FakeSource, Pipe, open_ledger
config = PipelineConfig.from_dict(json.loads(sys.argv[1]))
pipe = Pipe(config, open_ledger(sys.argv[2]), lambda: FakeSource({("in", 0): 100}))
print(pipe.commit(BatchId(config.pipeline_id, int(sys.argv[3]))))
"""


def test_a_commit_killed_between_files_and_manifest_recovers_every_file_once_and_whole(spark, object_storage, lake,
                                                                                       tmp_path):
    bucket, client = lake[0], object_storage.client()
    pipe, prepared, values = written(spark, tmp_path, lake, "crash")
    faults = tmp_path / "faults"
    arm(faults, "notify.mid_sink_commit", "kill")
    killed = subprocess.run(
        [sys.executable, "-c", COMMIT_IN_A_PROCESS, json.dumps(pipe.config.to_dict()), str(tmp_path / "ledger.db"),
         str(prepared.seq)], env={**os.environ, FAULTS_ENV: str(faults), "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=180)
    assert killed.returncode == -9, killed.stderr[-2000:]  # SIGKILL after the first file, as a dying worker
    assert len(batch_objects(client, bucket)) == 1  # one file completed (a lister sees it) ...
    assert manifest_rows(client, bucket) == [] and pipe.state(prepared.id) is BatchState.PREPARED  # ... no entry

    pipe.new_coordinator().recover()  # the next run's plan: recovery completes the rest
    assert pipe.state(prepared.id) is BatchState.COMMITTED
    assert_exactly_once(values, [r["value"] for r in listed(client, bucket)])
    assert_exactly_once(values, [r["value"] for r in manifest_rows(client, bucket)])
    assert s3_open_uploads(client, bucket, "orders/") == []


def test_abort_after_a_killed_attempt_leaves_no_open_upload(spark, object_storage, lake, tmp_path):
    bucket, client = lake[0], object_storage.client()
    pipe = make_pipe(tmp_path, lake)
    planned = pipe.planted_batch("run-1", RANGE)
    pipe.stage(frame_of(spark, "killed")[0], pipe.claim(planned.id))  # staged; the write died before the ledger
    assert len(s3_open_uploads(client, bucket, "orders/")) == 3
    assert "aborted 3 upload(s)" in pipe.abort(planned.id)  # the uploads were found by listing, not the ledger
    assert s3_open_uploads(client, bucket, "orders/") == [] and batch_objects(client, bucket) == []
    with pytest.raises(FencedError):
        pipe.claim(planned.id)


def test_the_storage_server_restarted_between_write_and_commit(spark, object_storage, lake, tmp_path):
    bucket, client = lake[0], object_storage.client()
    pipe, prepared, values = written(spark, tmp_path, lake, "restart")
    object_storage.restart()  # same port, same data folder: the open uploads outlive it
    pipe.new_coordinator().commit(prepared.id)
    assert_exactly_once(values, [r["value"] for r in listed(client, bucket)])
    assert s3_open_uploads(client, bucket, "orders/") == []


def test_a_bucket_that_does_not_exist_is_named_at_plan_time(object_storage, lake, tmp_path):
    committer = create_committer({"type": "parquet", "path": "s3://no-such-bucket/orders", "aws_conn_id": lake[1]})
    with pytest.raises(BucketNotFoundError, match="'no-such-bucket' does not exist.*create it, or change the sink's "
                                                  "path") as caught:
        committer.check("p")
    assert caught.value.retriable is False


def test_wrong_credentials_are_named_without_the_secret(object_storage, lake, tmp_path, monkeypatch):
    wrong = {**object_storage.connection(), "password": "not-the-secret-key"}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_WRONG", json.dumps(wrong))
    committer = create_committer({"type": "parquet", "path": f"s3://{lake[0]}/orders", "aws_conn_id": "lake_wrong"})
    with pytest.raises(StorageCredentialsError, match="refused the credentials of the aws connection 'lake_wrong'"
                       ) as caught:
        committer.check("p")
    assert caught.value.retriable is False
    assert "not-the-secret-key" not in str(caught.value) and object_storage.secret_key not in str(caught.value)


def test_an_unreachable_endpoint_is_retriable(monkeypatch):
    down = {"conn_type": "aws", "login": "k", "password": "s",
            "extra": {"endpoint_url": f"http://127.0.0.1:{reserve_port()}", "region_name": "us-east-1"}}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_DOWN", json.dumps(down))
    committer = create_committer({"type": "parquet", "path": "s3://lake/orders", "aws_conn_id": "lake_down"})
    with pytest.raises(StorageUnreachableError, match="did not answer.*endpoint_url of the aws connection") as caught:
        committer.check("p")
    assert isinstance(caught.value, SinkError) and caught.value.retriable is True


@pytest.mark.parametrize("path", ["gs://lake/orders", "abfss://c@account.dfs.core.windows.net/x", "hdfs://nn/x"])
def test_an_unsupported_scheme_names_the_supported_ones(path):
    with pytest.raises(ConfigurationError, match=r"is not supported for object storage; supported: s3://, s3a://"):
        create_committer({"type": "parquet", "path": path})
