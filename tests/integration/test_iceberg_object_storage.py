"""The Iceberg sink with its warehouse on object storage: this worker's S3-compatible server (s3proxy), Spark
writing with Iceberg's S3FileIO, pyiceberg committing with pyarrow's S3, credentials from an Airflow `aws`
connection; the catalog on the tests' PostgreSQL (JDBC) or Iceberg's REST server (whose own warehouse is on the
same server: it writes table metadata there).

Each test reads the table back with pyiceberg (and Spark where it says so) and compares it with the input exactly;
crashes are real processes killed at a named protocol step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from airflow_exactly_once.core.faults import ENV as FAULTS_ENV
from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.storage.errors import BucketNotFoundError, StorageCredentialsError
from tests.conftest import PG_DATABASE
from tests.harness import FakeSource, Pipe, open_ledger, pipeline_config
from tests.helpers import assert_exactly_once, iceberg_staged
from tests.integration.test_iceberg_sink import Pipeline, frame, read_pyiceberg, read_spark

ROOT = Path(__file__).resolve().parents[2]
CATALOGS = ["postgres", "rest"]


def aws_connection(monkeypatch, connection: dict) -> str:
    """An Airflow `aws` connection (AIRFLOW_CONN_<ID>, seen by this process and the ones it starts); its id."""
    conn_id = f"lake_{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))
    return conn_id


def lake_spec(request, kind: str, conn_id: str, bucket: str | None = None) -> dict:
    """A fresh table in a warehouse on s3proxy: a bucket of its own under a PostgreSQL catalog, or the REST
    server's warehouse (the sink names it by its location)."""
    name = uuid.uuid4().hex[:8]  # one Spark session serves every test: a catalog name per test
    if kind == "rest":
        server = request.getfixturevalue("iceberg_rest_s3")
        catalog = {"type": "rest", "name": f"r{name}", "uri": server.uri}
        warehouse = server.properties["warehouse"]
    else:
        catalog = {"type": "postgres", "name": f"c{name}",
                   "url": request.getfixturevalue("postgres").dsn(PG_DATABASE)}
        bucket = bucket or request.getfixturevalue("object_storage").create_bucket(f"ice-{name}")
        warehouse = f"s3://{bucket}/lake"
    return {"type": "iceberg", "table": f"db.t_{name}", "warehouse": warehouse, "aws_conn_id": conn_id,
            "catalog": catalog, "create_table": True}


@pytest.fixture
def conn_id(object_storage, monkeypatch) -> str:
    return aws_connection(monkeypatch, object_storage.connection())


def bucket_keys(object_storage, location: str) -> set[str]:
    """The objects under an s3:// location (a table's), as s3://bucket/key."""
    bucket, _, prefix = location.removeprefix("s3://").partition("/")
    listed = object_storage.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {f"s3://{bucket}/{o['Key']}" for o in listed}


def staged_data_files(committer, snapshot_id: int) -> set[str]:
    table = committer.load()
    return {f.file_path for f in committer.added_files(table, table.metadata.snapshot_by_id(snapshot_id))}


@pytest.mark.parametrize("kind", CATALOGS)
def test_batches_on_object_storage_are_exact_and_a_replay_commits_nothing(spark, object_storage, conn_id, request,
                                                                           tmp_path, kind):
    """plan -> write (Spark, S3FileIO) -> notify_complete (pyiceberg, pyarrow's S3): nothing of a PREPARED batch on
    main, exact rows read by pyiceberg and by Spark, one snapshot per batch, every file in the bucket."""
    pipe = Pipeline(tmp_path, lake_spec(request, kind, conn_id), max_records_per_partition=10)
    committer = pipe.sink.target.table_committer
    written: list[str] = []
    for run, start in (("run-1", 0), ("run-2", 10)):
        df, values = frame(spark, start, 10)
        prepared = pipe.write(pipe.plan(run).batch.id, df)
        staged = pipe.sink.committable(prepared.handles)
        assert staged_data_files(committer, staged.snapshot_id) <= bucket_keys(object_storage,
                                                                               committer.load().location())
        assert (read_pyiceberg(committer) if committer.load().current_snapshot() else []) == sorted(written)
        assert "published" in pipe.commit(prepared.id)
        assert "already" in pipe.new_coordinator().commit(prepared.id)  # a replayed notify_complete
        written += values
    table = committer.load()
    assert table.location().startswith(pipe.sink.spec["warehouse"])
    assert read_pyiceberg(committer) == sorted(written)
    assert read_spark(spark, pipe.sink.target) == sorted(written)
    assert [s.summary["aeo.batch"] for s in committer.main_history(table)] == [
        f"{pipe.config.pipeline_id}:2", f"{pipe.config.pipeline_id}:1"]
    assert set(committer.live_files(table)) <= bucket_keys(object_storage, table.location())
    assert iceberg_staged(committer) == []


@pytest.mark.parametrize("kind", CATALOGS)
def test_abort_drops_the_staged_snapshot_and_its_files_from_the_bucket(spark, object_storage, conn_id, request,
                                                                        tmp_path, kind):
    """A write attempt staged a snapshot and failed before the ledger knew: abort finds it in the table, drops it and
    deletes its data files from the bucket; the published batch stays whole."""
    pipe = Pipeline(tmp_path, lake_spec(request, kind, conn_id))
    committer = pipe.sink.target.table_committer
    kept, kept_values = frame(spark, 0, 5)
    pipe.commit(pipe.write(pipe.planted(5).id, kept).id)
    planned = pipe.planted(5)
    staged = pipe.stage(frame(spark, 100, 5)[0], pipe.claim(planned.id))  # the write failed before the ledger
    files = staged_data_files(committer, staged.snapshot_id)
    location = committer.load().location()
    assert files and files <= bucket_keys(object_storage, location)
    assert "dropped 1 staged snapshot" in pipe.abort(planned.id)  # found in the table, not in the ledger
    assert pipe.state(planned.id) is BatchState.ABORTED
    assert files & bucket_keys(object_storage, location) == set()  # the staged data files are gone from the bucket
    assert iceberg_staged(committer) == []
    assert read_pyiceberg(committer) == sorted(kept_values)  # the published batch is whole


def test_the_storage_server_restarted_between_write_and_commit(spark, object_storage, conn_id, request, tmp_path):
    pipe = Pipeline(tmp_path, lake_spec(request, "postgres", conn_id))
    df, values = frame(spark, 0, 10)
    prepared = pipe.write(pipe.planted(10).id, df)
    object_storage.restart()  # same port, same data folder
    assert "published" in pipe.new_coordinator().commit(prepared.id)
    committer = pipe.sink.target.table_committer
    assert_exactly_once(values, read_pyiceberg(committer))
    assert read_spark(spark, pipe.sink.target) == sorted(values)  # Spark's S3FileIO reads it after the restart too
    assert iceberg_staged(committer) == []


# -- crashes: a real notify_complete process killed at each step of the sink's commit ---------------------------

COMMIT_IN_A_PROCESS = """
import json, sys
from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.model import BatchId
from tests.harness import FakeSource, Pipe, open_ledger
config = PipelineConfig.from_dict(json.loads(sys.argv[1]))
pipe = Pipe(config, open_ledger(sys.argv[2]), lambda: FakeSource({("t", 0): 1000}))
print(pipe.commit(BatchId(config.pipeline_id, int(sys.argv[3]))))
"""


@pytest.mark.parametrize("point, kind", [("notify.before_sink_commit", "rest"),
                                         ("notify.after_sink_commit", "rest"),
                                         ("notify.after_sink_commit", "postgres")])
def test_a_notify_complete_killed_at_a_commit_step_ends_exact(spark, object_storage, conn_id, request, tmp_path,
                                                              point, kind):
    """The process that commits is SIGKILLed before or after publishing the staged snapshot on object storage; the
    next run's recovery publishes it once (or finds it published)."""
    pipe = Pipeline(tmp_path, lake_spec(request, kind, conn_id))
    committer = pipe.sink.target.table_committer
    first, first_values = frame(spark, 0, 6)
    pipe.commit(pipe.write(pipe.planted(6).id, first).id)
    df, values = frame(spark, 50, 6)
    prepared = pipe.write(pipe.planted(6).id, df)
    faults = tmp_path / "faults"
    arm(faults, point, "kill")
    killed = subprocess.run(
        [sys.executable, "-c", COMMIT_IN_A_PROCESS, json.dumps(pipe.config.to_dict()),
         str(tmp_path / f"ledger-{pipe.config.pipeline_id}.db"), str(prepared.seq)],
        env={**os.environ, FAULTS_ENV: str(faults), "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=180)
    assert killed.returncode == -9, killed.stderr[-2000:]  # SIGKILL at the point, as a dying worker
    assert pipe.state(prepared.id) is BatchState.PREPARED
    published = f"{pipe.config.pipeline_id}:{prepared.seq}" in {s.batch for s in committer.main_history(
        committer.load())}
    assert published is (point == "notify.after_sink_commit")
    pipe.coordinator = pipe.new_coordinator()  # the next run's process
    pipe.plan("run-next")  # recovery first: the PREPARED batch is committed (or found published)
    assert pipe.state(prepared.id) is BatchState.COMMITTED
    assert_exactly_once(first_values + values, read_pyiceberg(committer))
    assert iceberg_staged(committer) == []


def test_a_write_killed_after_staging_is_rewritten_once(spark, object_storage, conn_id, request, tmp_path):
    """A write attempt staged its snapshot on object storage and died before the ledger (write.after_stage): the
    retried write claims the batch again, and only the retry's rows reach main."""
    pipe = Pipeline(tmp_path, lake_spec(request, "rest", conn_id))
    planned = pipe.planted(8)
    pipe.stage(frame(spark, 100, 8)[0], pipe.claim(planned.id))  # the dead attempt's staged snapshot
    df, values = frame(spark, 0, 8)
    pipe.commit(pipe.write(planned.id, df).id)
    committer = pipe.sink.target.table_committer
    assert_exactly_once(values, read_pyiceberg(committer))
    assert iceberg_staged(committer) == []  # the dead attempt's snapshot dropped by the commit


# -- bad input: a clear error at plan time, not retried, nothing planned or made ---------------------------------

def plan_fails(tmp_path, spec: dict, expected: type[Exception]) -> Exception:
    config = pipeline_config(f"ice-s3-{uuid.uuid4().hex[:8]}", ["t"], spec)
    pipe = Pipe(config, open_ledger(tmp_path / f"{config.pipeline_id}.db"), lambda: FakeSource({("t", 0): 10}))
    with pytest.raises(expected) as err:
        pipe.plan("run-1")
    assert err.value.retriable is False
    assert pipe.ledger.list_batches(config.pipeline_id, list(BatchState)) == []  # nothing planned
    assert not pipe.sink.target.table_committer.exists()  # no table made
    return err.value


def test_a_bucket_that_does_not_exist_is_named_at_plan_time(object_storage, conn_id, request, tmp_path):
    spec = lake_spec(request, "postgres", conn_id, bucket="no-such-bucket")
    error = plan_fails(tmp_path, spec, BucketNotFoundError)
    assert "'no-such-bucket' does not exist" in str(error) and "change the sink's warehouse" in str(error)


@pytest.mark.parametrize("kind", CATALOGS)
def test_wrong_credentials_are_named_without_the_secret(object_storage, monkeypatch, request, tmp_path, kind):
    wrong = aws_connection(monkeypatch, {**object_storage.connection(), "password": "not-the-secret-key"})
    error = plan_fails(tmp_path, lake_spec(request, kind, wrong), StorageCredentialsError)
    assert f"refused the credentials of the aws connection '{wrong}'" in str(error)
    assert "not-the-secret-key" not in str(error) and object_storage.secret_key not in str(error)

