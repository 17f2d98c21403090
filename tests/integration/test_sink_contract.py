"""The contract every sink keeps, run against each sink on its real system with real Spark.

Output is invisible until commit; commit is idempotent; abort removes staged output; a
prepare that vanished behind the sink's back is reported lost (the batch goes back to the
next run); the output of a fenced write attempt never becomes visible; and whatever a batch
staged is gone once it is committed or aborted (nothing holds locks or offsets).

Every sink the registry finds (airflow_exactly_once.sinks.sink_types(): the built-in SPECS and those
installed distributions declare), and every variant its declaration names (`variant_classes`: the
Parquet sink's "parquet:s3"), runs every scenario; one without an adapter in ADAPTERS fails them
(docs/adding-a-sink.md). A sink that runs on another kind of system with the same classes (the Iceberg
sink through a REST catalog) adds a variant in VARIANTS: one more adapter, of a registered sink type,
that runs every scenario as well. A sink of another distribution brings its adapter through the
environment: AIRFLOW_EXACTLY_ONCE_SINK_ADAPTERS="module:Adapter[,module:Adapter]", each class with a
`sink_type`.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Protocol

import pytest
from kafka import KafkaAdminClient

from airflow_exactly_once.core.errors import FencedError, TransactionLostError
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.sinks import create_committer, sink_types, spec_type
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks.kafka.probe import matching_transactions
from airflow_exactly_once.sinks.kafka.end_txn import abort_transaction
from airflow_exactly_once.sinks.postgres.commit import list_prepared, rollback_prepared
from airflow_exactly_once.sinks.postgres.gids import gid_prefix
from airflow_exactly_once.spark.partition_writers import run_partition_writers
from tests.conftest import PG_DATABASE
from tests.harness import FakeSource, Pipe, open_ledger, pipeline_config
from tests.delta_helpers import delta_rows, delta_staged, delta_staged_s3, s3_options
from tests.helpers import (create_topic, iceberg_staged, pg_query, read_parquet, read_s3_parquet, s3_open_uploads,
                           staging_leftovers)
from tests.kafka_helpers import read_all


class SinkUnderTest(Protocol):
    """A sink's adapter: a spec on a fresh destination, and eyes on that destination."""

    spec: dict[str, Any]

    def visible(self) -> list[str]:
        """The `value`s a reader of the destination sees now."""

    def staged(self, pipeline_id: str) -> list[Any]:
        """What the pipeline's write attempts staged and nothing published or removed yet."""

    def lose(self, committable: Any) -> None:
        """Make (part of) a prepared batch's staged output vanish behind the sink's back, as it happens for real."""


# [START parquet_adapter]
class ParquetUnderTest:
    def __init__(self, request, tmp_path: Path) -> None:
        self.root = tmp_path / "out"
        self.spec = {"type": "parquet", "path": str(self.root)}

    def visible(self) -> list[str]:
        return sorted(row["value"] for row in read_parquet(self.root))

    def staged(self, pipeline_id: str) -> list[Path]:
        return staging_leftovers(self.root)

    def lose(self, committable) -> None:
        shutil.rmtree(committable.staging)  # e.g. a cleanup job emptied _staging
# [END parquet_adapter]


def s3_lake(request, name: str) -> tuple[Any, str, str]:
    """This worker's S3-compatible server, a fresh bucket on it and an `aws` connection to it (client, bucket, id)."""
    server = request.getfixturevalue("object_storage")
    request.getfixturevalue("monkeypatch").setenv(f"AIRFLOW_CONN_LAKE_{name.upper()}", json.dumps(server.connection()))
    return server.client(), server.create_bucket(f"contract-{name}"), f"lake_{name}"


class ParquetOnS3UnderTest:
    """The Parquet sink's s3 variant on this worker's S3-compatible server, credentials from an `aws` connection."""

    def __init__(self, request, tmp_path: Path) -> None:
        self.client, self.bucket, conn_id = s3_lake(request, uuid.uuid4().hex[:8])
        self.spec = {"type": "parquet", "path": f"s3://{self.bucket}/out", "aws_conn_id": conn_id}

    def visible(self) -> list[str]:
        return sorted(row["value"] for row in read_s3_parquet(self.client, self.bucket, "out/"))

    def staged(self, pipeline_id: str) -> list[str]:
        return s3_open_uploads(self.client, self.bucket, "out/")

    def lose(self, committable) -> None:  # e.g. a lifecycle rule's AbortIncompleteMultipartUpload
        last = committable.files[-1]
        self.client.abort_multipart_upload(Bucket=self.bucket, Key=last.key, UploadId=last.upload_id)


class KafkaUnderTest:
    def __init__(self, request, tmp_path: Path) -> None:
        self.kafka = request.getfixturevalue("kafka")
        self.topic = f"contract-{uuid.uuid4().hex[:8]}"
        create_topic(self.kafka.bootstrap_servers, self.topic, partitions=2)
        self.spec = {"type": "kafka", "topic": self.topic, "bootstrap_servers": self.kafka.bootstrap_servers}

    def visible(self) -> list[str]:
        return sorted(read_all(self.kafka.bootstrap_servers, self.topic, settle=False))

    def staged(self, pipeline_id: str) -> list[str]:
        """The pipeline's transactions still open (pre-committed) on the broker."""
        admin = KafkaAdminClient(bootstrap_servers=self.kafka.bootstrap_servers)
        try:
            known = matching_transactions(admin, KafkaSettings(self.kafka.bootstrap_servers),
                                          re.escape(f"{pipeline_id}-") + r"\d+-\d+")
        finally:
            admin.close()
        return sorted(tid for tid, state in known.items() if state == "Ongoing")

    def lose(self, committable) -> None:
        for report in committable.transactions:  # e.g. the broker timed them out
            abort_transaction(self.kafka.bootstrap_servers, report.transaction)


class PostgresUnderTest:
    def __init__(self, request, tmp_path: Path) -> None:
        self.dsn = request.getfixturevalue("postgres").dsn(PG_DATABASE)
        self.table = f"contract_{uuid.uuid4().hex[:8]}"
        pg_query(self.dsn, f"CREATE TABLE {self.table} (key text, value text)")
        self.spec = {"type": "postgres", "url": self.dsn, "table": self.table}

    def visible(self) -> list[str]:
        return sorted(r[0] for r in pg_query(self.dsn, f"SELECT value FROM {self.table}"))

    def staged(self, pipeline_id: str) -> list[str]:
        return list_prepared(self.dsn, gid_prefix(pipeline_id))

    def lose(self, committable) -> None:
        assert len(committable.gids) > 1, "the batch should span several prepared transactions"
        rollback_prepared(self.dsn, committable.gids[-1])  # e.g. an operator's ROLLBACK PREPARED of one of them


class IcebergUnderTest:
    def __init__(self, request, tmp_path: Path) -> None:
        name = uuid.uuid4().hex[:8]  # one Spark session for every test: a catalog name per table
        self.spec = {"type": "iceberg", "table": f"db.contract_{name}", "warehouse": str(tmp_path / "lake"),
                     "catalog": {"name": f"c{name}"}, "create_table": True}
        self.committer = create_committer(self.spec).target.table_committer

    def visible(self) -> list[str]:
        table = self.committer.load() if self.committer.exists() else None
        if table is None or table.current_snapshot() is None:
            return []
        return sorted(table.scan().to_arrow().column("value").to_pylist())

    def staged(self, pipeline_id: str) -> list[int]:
        return iceberg_staged(self.committer) if self.committer.exists() else []

    def lose(self, committable) -> None:  # e.g. snapshot maintenance expired the staged snapshot
        self.committer.load().maintenance.expire_snapshots().by_id(committable.snapshot_id).commit()


class IcebergRestUnderTest(IcebergUnderTest):
    """The Iceberg sink through the session's REST catalog (Iceberg's own server behind the test gateway)."""

    sink_type = "iceberg"

    def __init__(self, request, tmp_path: Path) -> None:
        from tests.conftest import REST_TOKEN, REST_WAREHOUSE

        gateway = request.getfixturevalue("rest_gateway")
        name = uuid.uuid4().hex[:8]
        self.spec = {"type": "iceberg", "table": f"db.contract_{name}", "warehouse": REST_WAREHOUSE,
                     "catalog": {"type": "rest", "name": f"r{name}", "uri": gateway.uri, "token": REST_TOKEN},
                     "create_table": True}
        self.committer = create_committer(self.spec).target.table_committer


class IcebergOnS3UnderTest(IcebergUnderTest):
    """The Iceberg sink's s3 variant: its warehouse on this worker's S3-compatible server (Spark's S3FileIO, pyiceberg's
    pyarrow S3), its catalog on the tests' PostgreSQL, credentials from an `aws` connection."""

    def __init__(self, request, tmp_path: Path) -> None:
        name = uuid.uuid4().hex[:8]
        _, bucket, conn_id = s3_lake(request, name)
        self.spec = {"type": "iceberg", "table": f"db.contract_{name}", "warehouse": f"s3://{bucket}/lake",
                     "aws_conn_id": conn_id, "create_table": True,
                     "catalog": {"type": "postgres", "name": f"c{name}",
                                 "url": request.getfixturevalue("postgres").dsn(PG_DATABASE)}}
        self.committer = create_committer(self.spec).target.table_committer


class DeltaUnderTest:
    def __init__(self, request, tmp_path: Path) -> None:
        self.root = tmp_path / "delta"
        self.spec = {"type": "delta", "path": str(self.root), "create_table": True}

    def visible(self) -> list[str]:
        return sorted(delta_rows(self.root, "value"))

    def staged(self, pipeline_id: str) -> list[str]:
        return delta_staged(self.root)

    def lose(self, committable) -> None:
        shutil.rmtree(self.root / committable.folder)  # e.g. a cleanup job emptied _aeo_staging


class DeltaOnS3UnderTest:
    """The Delta sink's s3 variant on this worker's S3-compatible server (pyarrow partition writers stage, delta-rs
    commits), credentials from an `aws` connection. s3proxy ignores If-None-Match, so the spec declares its single
    writer (sinks.delta.object_folder)."""

    def __init__(self, request, tmp_path: Path) -> None:
        self.client, self.bucket, conn_id = s3_lake(request, uuid.uuid4().hex[:8])
        self.options = s3_options(request.getfixturevalue("object_storage"))
        self.spec = {"type": "delta", "path": f"s3://{self.bucket}/delta", "aws_conn_id": conn_id,
                     "create_table": True, "single_writer": True}

    def visible(self) -> list[str]:
        return sorted(delta_rows(f"s3://{self.bucket}/delta", "value", options=self.options))

    def staged(self, pipeline_id: str) -> list[str]:
        return delta_staged_s3(self.client, self.bucket, "delta", self.options)

    def lose(self, committable) -> None:  # e.g. a lifecycle rule expired _aeo_staging
        for path in committable.files:
            self.client.delete_object(Bucket=self.bucket, Key=f"delta/{path}")


# [START adapters]
# By sink type, and "<type>:<variant>" for each variant a declaration names (core.declaration.SinkSpec.variant_classes).
ADAPTERS: dict[str, type[SinkUnderTest]] = {"parquet": ParquetUnderTest, "parquet:s3": ParquetOnS3UnderTest,
                                            "kafka": KafkaUnderTest, "postgres": PostgresUnderTest,
                                            "iceberg": IcebergUnderTest, "iceberg:s3": IcebergOnS3UnderTest,
                                            "delta": DeltaUnderTest, "delta:s3": DeltaOnS3UnderTest}
# [END adapters]
# Further adapters of registered sinks on other systems: every scenario runs on each too (id -> adapter).
VARIANTS: dict[str, type[SinkUnderTest]] = {"iceberg-rest": IcebergRestUnderTest}

# [START adapter_hook]
ADAPTERS_VARIABLE = "AIRFLOW_EXACTLY_ONCE_SINK_ADAPTERS"


def named_adapters(names: str) -> dict[str, type[SinkUnderTest]]:
    """The adapters "module:Class,module:Class" names (another distribution's sinks), by their `sink_type`."""
    found: dict[str, type[SinkUnderTest]] = {}
    for name in filter(None, (n.strip() for n in names.split(","))):
        module, _, attribute = name.partition(":")
        adapter = getattr(importlib.import_module(module), attribute)
        found[adapter.sink_type] = adapter
    return found


ADAPTERS.update(named_adapters(os.environ.get(ADAPTERS_VARIABLE, "")))
# [END adapter_hook]


def contract_cases(kinds: list[str]) -> list[str]:
    """Each sink type of `kinds`, and "<type>:<variant>" for each variant its declaration names."""
    return sorted(case for kind in kinds
                  for case in (kind, *(f"{kind}:{v}" for v in spec_type({"type": kind}).variant_classes)))


def registered_sinks() -> list[str]:
    """The sink types (and their variants) the contract runs: the registry's, built in and installed, read when the
    tests are collected."""
    return contract_cases(sink_types())


def adapter_for(kind: str) -> type[SinkUnderTest]:
    """A registered sink without an adapter fails the contract instead of escaping it."""
    if kind not in ADAPTERS:
        pytest.fail(f"the {kind!r} sink is registered in SPECS (airflow_exactly_once/sinks/__init__.py) or "
                    "installed by another distribution, but has no adapter in ADAPTERS of "
                    f"tests/integration/test_sink_contract.py nor in {ADAPTERS_VARIABLE}: write one "
                    "(docs/adding-a-sink.md)", pytrace=False)
    return ADAPTERS[kind]


def pytest_generate_tests(metafunc) -> None:
    if "sink" in metafunc.fixturenames:
        metafunc.parametrize("sink", registered_sinks() + sorted(VARIANTS), indirect=True)


@pytest.fixture
def sink(request, tmp_path) -> SinkUnderTest:
    adapter = VARIANTS.get(request.param) or adapter_for(request.param)
    return adapter(request, tmp_path)


@pytest.fixture
def pipe(sink, tmp_path) -> Pipe:
    config = pipeline_config(f"contract-{uuid.uuid4().hex[:8]}", ["in"], sink.spec)
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: FakeSource({("in", 0): 100}),
                run_writers=run_partition_writers)
    pipe.sink.check(config.pipeline_id)
    return pipe


def rows(spark, prefix: str, n: int = 12):
    """What a transform hands the sink: `key` and `value` strings over three Spark partitions."""
    values = [f"{prefix}-{i}" for i in range(n)]
    return spark.createDataFrame([(v, v) for v in values], "key STRING, value STRING").repartition(3), values


def batch(pipe: Pipe):
    return pipe.planted_batch("run-1", [OffsetRange("in", 0, 0, 12)])


def test_output_is_invisible_until_commit_and_commit_is_idempotent(spark, sink, pipe):
    frame, values = rows(spark, "a")
    prepared = pipe.write(batch(pipe).id, frame)
    assert prepared.state is BatchState.PREPARED
    assert sink.visible() == []
    pipe.commit(prepared.id)
    assert sink.visible() == sorted(values)
    assert "already" in pipe.commit(prepared.id)
    pipe.sink.commit(prepared, pipe.sink.committable(prepared.handles))  # again, below the ledger
    assert sink.visible() == sorted(values)
    assert sink.staged(pipe.config.pipeline_id) == []


def test_abort_removes_the_staged_output(spark, sink, pipe):
    frame, _ = rows(spark, "b")
    planned = batch(pipe)
    staged = pipe.stage(frame, pipe.claim(planned.id))  # the write attempt died here
    assert sink.staged(pipe.config.pipeline_id) != []
    pipe.abort(planned.id)
    assert sink.staged(pipe.config.pipeline_id) == []
    assert pipe.state(planned.id) is BatchState.ABORTED
    with pytest.raises(TransactionLostError):
        pipe.sink.commit(pipe.ledger.get_batch(planned.id), staged)  # nothing left to publish
    assert sink.visible() == []


def test_a_lost_prepare_is_reported_and_the_range_freed(spark, sink, pipe):
    frame, _ = rows(spark, "c")
    prepared = pipe.write(batch(pipe).id, frame)
    sink.lose(pipe.sink.committable(prepared.handles))
    with pytest.raises(TransactionLostError, match="processed again"):
        pipe.commit(prepared.id)
    assert pipe.state(prepared.id) is BatchState.ABORTED
    assert sink.visible() == []  # nothing of the batch, not even the part that was not lost
    assert sink.staged(pipe.config.pipeline_id) == []  # ... and nothing of it left holding locks or offsets


def test_a_fenced_attempt_never_becomes_visible(spark, sink, pipe):
    planned = batch(pipe)
    zombie = pipe.claim(planned.id)
    zombie_output = pipe.stage(rows(spark, "zombie")[0], zombie)  # then it stalled...
    retry = pipe.claim(planned.id)  # ...and Airflow's retry claimed the batch anew
    frame, values = rows(spark, "retry")
    retry_output = pipe.stage(frame, retry)
    with pytest.raises(FencedError):
        pipe.coordinator.prepare(zombie, zombie_output, 12, 12)
    pipe.coordinator.prepare(retry, retry_output, 12, 12)
    pipe.commit(planned.id)
    assert sink.visible() == sorted(values)
    assert sink.staged(pipe.config.pipeline_id) == []  # the zombie's output was removed too
