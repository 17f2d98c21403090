"""The Delta sink on object storage (s3://): pyarrow partition writers stage on the tests' S3-compatible server
(s3proxy), delta-rs commits there; credentials from an Airflow `aws` connection. The contract suite's `delta:s3`
case covers the rest (invisible until commit, idempotent commit, abort deleting the attempt's prefix, lost staged
files, fenced attempts).

s3proxy 2.6.0 accepts a PUT with `If-None-Match: *` over an existing object, so it does not keep delta-rs's
commits apart: the sink refuses it unless the spec declares a single writer, and these tests declare one (the
refusal is tested too). Tables are read with delta-rs (Spark's Delta reader would need S3A's jars).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.sinks.delta.commits import RETENTION_PROPERTY, STAGING, attempt_folder
from airflow_exactly_once.storage.errors import BucketNotFoundError, StorageCredentialsError
from tests.delta_helpers import delta_rows, delta_staged_s3, live_paths, s3_options
from tests.harness import Pipe
from tests.integration.test_delta_sink import new_pipe, planted, rows_of

SCHEMA = "key STRING NOT NULL, value STRING, part STRING"  # the table gets a NOT NULL column


class Lake:
    """A bucket on the tests' server and an `aws` connection to it."""

    def __init__(self, server: Any, monkeypatch: Any) -> None:
        self.server, self.client = server, server.client()
        self.bucket = server.create_bucket(f"delta-{uuid.uuid4().hex[:8]}")
        self.conn_id = f"lake_{uuid.uuid4().hex[:8]}"
        monkeypatch.setenv(f"AIRFLOW_CONN_{self.conn_id.upper()}", json.dumps(server.connection()))
        self.options = s3_options(server)

    def url(self, table: str) -> str:
        return f"s3://{self.bucket}/{table}"

    def keys(self, prefix: str = "") -> list[str]:
        return sorted(o["Key"] for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix) for o in page.get("Contents", []))

    def open_uploads(self, prefix: str = "") -> list[str]:
        return [u["Key"] for u in self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=prefix).get(
            "Uploads", [])]

    def staged(self, table: str) -> list[str]:
        return delta_staged_s3(self.client, self.bucket, table, self.options)

    def rows(self, table: str, column: str | None = None, version: int | None = None) -> list[Any]:
        return delta_rows(self.url(table), column, version, self.options)

    def table(self, table: str) -> DeltaTable:
        return DeltaTable(self.url(table), storage_options=self.options)


@pytest.fixture
def lake(object_storage, monkeypatch) -> Lake:
    return Lake(object_storage, monkeypatch)


def s3_pipe(lake: Lake, table: str, ledger: Any, **spec: Any) -> Pipe:
    """test_delta_sink's pipeline (partitioned by `part`, the table created), its table on the lake."""
    return new_pipe(lake.url(table), ledger, **{"aws_conn_id": lake.conn_id, "single_writer": True, **spec})


def frame(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    return spark.createDataFrame(rows, SCHEMA).repartition(2)  # both Spark partitions hold several part values


def publish(pipe: Pipe, spark: Any, prefix: str, start: int) -> tuple[Batch, list[str]]:
    rows = rows_of(prefix)
    prepared = pipe.write(planted(pipe, start).id, frame(spark, rows))
    pipe.commit(prepared.id)
    return pipe.ledger.get_batch(prepared.id), [r[1] for r in rows]


def test_a_batch_is_one_commit_with_its_statistics_a_replay_adds_nothing_and_withdrawn_files_go_later(
        spark, lake, tmp_path):
    pipe = s3_pipe(lake, "events", tmp_path / "ledger.db")
    prepared = pipe.write(planted(pipe, 0).id, frame(spark, rows_of("one")))
    staged = pipe.sink.committable(prepared.handles)
    assert len(staged.files) >= 3 and lake.rows("events") == []  # staged as objects: no reader sees them
    assert all(k in lake.keys("events/") for k in (f"events/{f}" for f in staged.files))
    assert lake.open_uploads("events/") == []  # each writer completed its own upload
    pipe.commit(prepared.id)
    first = pipe.ledger.get_batch(prepared.id)
    one = sorted(r[1] for r in rows_of("one"))

    table = lake.table("events")
    assert table.version() == 1  # created, then one version for the batch
    assert sorted((r["value"], r["part"]) for r in lake.rows("events")) == sorted(
        (r[1], r[2]) for r in rows_of("one"))  # partition values from the log, nulls included
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    assert sum(actions["num_records"]) == 9 and all(v is not None for v in actions["min.key"])  # writer's stats
    assert all(n == 0 for n in actions["null_count.key"]) and set(actions["partition.part"]) == {"a b", "x:y", None}
    assert all(p.startswith(f"{STAGING}/") for p in live_paths(lake.url("events"), lake.options))
    history = table.history(1)[0]
    assert (history["aeo.batch"], history["aeo.attempt"]) == (f"{pipe.config.pipeline_id}:{first.seq}",
                                                            str(first.epoch))
    again = pipe.sink.commit(first, pipe.sink.committable(first.handles))  # a replay below the ledger
    assert "already published" in again and lake.table("events").version() == 1
    assert lake.staged("events") == []

    # A null in the table's NOT NULL column fails the write in the partition writer; nothing of it stays.
    nulls = spark.createDataFrame([("k", "v", "a"), (None, "w", "a")], "key STRING, value STRING, part STRING")
    with pytest.raises(ConfigurationError, match=r"nulls in NOT NULL columns .*'key': 1"):
        pipe.write(planted(pipe, 9).id, nulls)
    assert lake.staged("events") == [] and lake.open_uploads("events/") == []

    # Replacing and retracting are one commit each; the withdrawn folders go after the retention.
    rows = rows_of("new")
    claimed = pipe.claim(planted(pipe, 18).id)
    replacement = pipe.stage(frame(spark, rows), claimed)
    assert "removing batch" in pipe.sink.commit_replacing(claimed, replacement, replaced=first)
    assert sorted(lake.rows("events", "value")) == sorted(r[1] for r in rows)
    assert sorted(lake.rows("events", "value", version=1)) == one  # time travel to before the replacement
    assert "withdrew" in pipe.sink.retract(claimed, replacement)
    assert lake.rows("events") == [] and lake.table("events").version() == 3
    withdrawn = [attempt_folder(b.pipeline_id, b.seq, b.epoch) for b in (first, claimed)]
    assert all(lake.keys(f"events/{f}/") for f in withdrawn)  # kept for time travel within the retention
    lake.table("events").alter.set_table_properties({RETENTION_PROPERTY: "interval 1 second"})
    time.sleep(1.1)
    _, later = publish(pipe, spark, "later", 27)
    assert not any(lake.keys(f"events/{f}/") for f in withdrawn)
    assert not lake.keys(f"events/{STAGING}/{pipe.config.pipeline_id}/_withdrawn/")  # their markers too
    assert sorted(lake.rows("events", "value")) == sorted(later)


def test_bad_storage_is_refused_at_plan_time_with_what_to_change_and_nothing_left(
        object_storage, lake, tmp_path, monkeypatch):
    missing = f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/t"
    with pytest.raises(BucketNotFoundError, match="does not exist .*create it, or change the sink's path"):
        s3_pipe(lake, "x", tmp_path / "l1.db", path=missing)

    wrong = {**object_storage.connection(), "password": "not-the-secret"}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_WRONG", json.dumps(wrong))
    with pytest.raises(StorageCredentialsError, match="refused the credentials of the aws connection 'lake_wrong'"):
        s3_pipe(lake, "t", tmp_path / "l2.db", aws_conn_id="lake_wrong")
    assert lake.keys() == []

    # s3proxy lets a conditional PUT overwrite: without the single-writer declaration the sink refuses it.
    with pytest.raises(ConfigurationError, match="does not honour conditional writes .*'single_writer': True"):
        s3_pipe(lake, "t", tmp_path / "l3.db", single_writer=False)
    assert lake.keys() == []  # the probe's object is gone too
