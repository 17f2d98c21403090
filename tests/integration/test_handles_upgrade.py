"""After an upgrade, a batch the previous release left PREPARED is committed exactly, with each real sink.

The previous release wrote a committable's handles unversioned (format version 1, pinned by
tests/fixtures/handles). Each test stages a real batch on the sink's real system (Spark,
Kafka, PostgreSQL, an Iceberg table, Parquet folders), stores its handles in the ledger in
exactly that layout (the same keys and nesting as the fixture; no version key), and lets this
release's recovery commit it: the output is exactly the batch, and nothing stays staged.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

from airflow_exactly_once.core.handles import VERSION_KEY
from airflow_exactly_once.core.model import Batch, OffsetRange
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.sinks.dead_letters import DEAD_LETTER_HANDLES
from airflow_exactly_once.spark.partition_writers import run_partition_writers
from tests.harness import FakeSource, Pipe, open_ledger, pipeline_config
from tests.helpers import read_parquet, staging_leftovers
from tests.integration.test_sink_contract import ADAPTERS, rows

FIXTURES = Path(__file__).parents[1] / "fixtures" / "handles"


# The first release's handles, written out here field by field (not by today's classes), as its
# committables' to_handles wrote them and core.protocol added "records".
def parquet_v1(staged: Any) -> dict[str, Any]:
    return {"staging": staged.staging, "final": staged.final, "files": list(staged.files)}


def postgres_v1(staged: Any) -> dict[str, Any]:
    return {"table": staged.table, "mode": staged.mode, "epoch": staged.epoch, "gids": list(staged.gids),
            "rows_written": staged.rows_written}


def kafka_v1(staged: Any) -> dict[str, Any]:
    def transaction(handle: Any) -> dict[str, Any] | None:
        return None if handle is None else {
            "transactional_id": handle.transactional_id, "producer_id": handle.producer_id, "epoch": handle.epoch,
            "partitions": [[topic, partition] for topic, partition in handle.partitions], "started": handle.started}

    return {"guarantee": staged.guarantee, "bootstrap_servers": staged.bootstrap_servers, "topic": staged.topic,
            "writers": [{"partition": r.partition, "records": r.records,
                         "first_offsets": [list(o) for o in r.first_offsets],
                         "transaction": transaction(r.transaction)} for r in staged.reports]}


def iceberg_v1(staged: Any) -> dict[str, Any]:
    return {"table": staged.table, "wap_id": staged.wap_id, "snapshot_id": staged.snapshot_id}


V1_LAYOUTS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "parquet": parquet_v1, "postgres": postgres_v1, "kafka": kafka_v1, "iceberg": iceberg_v1}


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}-v1.json").read_text())


def same_layout(a: Any, b: Any) -> bool:
    """The same keys, nested the same way (values and list lengths aside)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_layout(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return all(same_layout(x, y) for x in a for y in b)
    return not isinstance(a, (dict, list)) and not isinstance(b, (dict, list))


def prepare_as_v1(pipe: Pipe, claimed: Batch, handles: dict[str, Any], fixture_name: str, records: int) -> None:
    """What the previous release's prepare left in the ledger; checked against its fixture as stored."""
    pipe.ledger.mark_prepared(claimed.id, claimed.epoch, {**handles, "records": records}, records, records)
    stored = pipe.ledger.get_batch(claimed.id).handles
    assert same_layout(stored, fixture(fixture_name)), (stored, fixture(fixture_name))
    assert VERSION_KEY not in json.dumps(stored)


def recover_after_upgrade(pipe: Pipe, batch: Batch) -> None:
    """The next run's plan on this release: recovery commits the PREPARED batch from its stored handles."""
    coordinator = pipe.new_coordinator()
    coordinator.recover()
    assert coordinator.recovered == [batch.id]
    assert pipe.state(batch.id) is BatchState.COMMITTED


def new_pipe(spec: dict[str, Any], tmp_path: Path, **settings: Any) -> Pipe:
    config = pipeline_config(f"upgrade-{uuid.uuid4().hex[:8]}", ["in"], spec, **settings)
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: FakeSource({("in", 0): 100}),
                run_writers=run_partition_writers)
    pipe.sink.check(config.pipeline_id)
    return pipe


@pytest.mark.parametrize("kind", sorted(V1_LAYOUTS))
def test_a_batch_prepared_in_v1_handles_is_committed_after_the_upgrade(spark, request, tmp_path, kind):
    sink = ADAPTERS[kind](request, tmp_path)
    pipe = new_pipe(sink.spec, tmp_path)
    frame, values = rows(spark, kind)
    claimed = pipe.claim(pipe.planted_batch("run-1", [OffsetRange("in", 0, 0, 12)]).id)
    staged = pipe.stage(frame, claimed)
    prepare_as_v1(pipe, claimed, V1_LAYOUTS[kind](staged), kind, len(values))
    assert sink.visible() == []

    recover_after_upgrade(pipe, claimed)
    assert sink.visible() == sorted(values)
    assert sink.staged(pipe.config.pipeline_id) == []


def test_a_dead_letter_pair_prepared_in_v1_handles_is_committed_after_the_upgrade(spark, tmp_path):
    root = tmp_path / "out"
    pipe = new_pipe({"type": "parquet", "path": str(root)}, tmp_path, bad_record_policy="dead_letter")
    good, values = rows(spark, "good", 11)
    bad = spark.createDataFrame([("k", "not json", "value is not JSON")], "key STRING, value STRING, error STRING")
    claimed = pipe.claim(pipe.planted_batch("run-1", [OffsetRange("in", 0, 0, 12)]).id)
    staged = pipe.writer.stage_batch(good, bad, claimed, run_partition_writers)
    handles = {**parquet_v1(staged.output), DEAD_LETTER_HANDLES: parquet_v1(staged.dead_letters)}
    prepare_as_v1(pipe, claimed, handles, "dead-letter-parquet", len(values))
    assert read_parquet(root) == [] and read_parquet(root / "_dead_letter") == []

    recover_after_upgrade(pipe, claimed)
    assert sorted(r["value"] for r in read_parquet(root)) == sorted(values)
    assert [(r["value"], r["error"]) for r in read_parquet(root / "_dead_letter")] == [
        ("not json", "value is not JSON")]
    assert staging_leftovers(root) == [] and staging_leftovers(root / "_dead_letter") == []
