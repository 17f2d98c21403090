"""Pooled transactional ids and the `transactions` CLI, against the real broker and a real (SQLite) ledger.

Writes go through the sink's own partition writer (no Spark: these tests are about the ids and
the coordinator's view of them); batches are recorded by the coordinator as a write task would.
"""

from __future__ import annotations

import json
import uuid

import pytest
from kafka import KafkaAdminClient

from airflow_exactly_once.cli.main import main
from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import SinkError
from airflow_exactly_once.core.model import Batch, OffsetRange
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks.kafka import probe
from airflow_exactly_once.sinks.kafka.committable import KafkaCommittable
from airflow_exactly_once.sinks.kafka.writer import KafkaPartitionWriter
from tests.harness import FakeSource, Pipe, open_ledger
from tests.helpers import create_topic
from tests.integration.test_kafka_transactions import write_and_pre_commit
from tests.kafka_helpers import read_all, settled_transaction_state


FENCED = ("Empty", "CompleteAbort")  # InitProducerId aborted the open transaction (Empty: the new epoch's)


def new_pipe(kafka, tmp_path, **sink) -> Pipe:
    name = f"txids-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap_servers, f"{name}-out", partitions=2)
    config = checked(PipelineConfig(pipeline_id=name, topics=[f"{name}-in"],
                                    sink={"type": "kafka", "topic": f"{name}-out", **sink},
                                    bootstrap_servers=kafka.bootstrap_servers))
    return Pipe(config, open_ledger(tmp_path / f"{name}.db"), lambda: FakeSource({(f"{name}-in", 0): 1000}))


def planted(pipe: Pipe, seq: int) -> Batch:
    """A PLANNED batch of ten offsets per seq (the ledger numbers them 1, 2, ...)."""
    batch = pipe.planted_batch(f"run-{seq}", [OffsetRange(pipe.config.topics[0], 0, 10 * seq, 10 * seq + 10)])
    assert batch.seq == seq
    return batch


def stage(pipe: Pipe, batch: Batch, pooled: bool = True) -> KafkaCommittable:
    """The write's staging: one record per output partition, each in its own pre-committed transaction (pooled
    ids as this release names them, or per-batch ids as the first releases did)."""
    output = pipe.sink.output
    naming = output.naming if pooled else None
    if pooled:
        naming.ensure_free(batch, pipe.ledger)
    writer = KafkaPartitionWriter(output.topic, "EXACTLY_ONCE", output.id_prefix, batch.seq, 120_000,
                                  KafkaSettings.of(pipe.config), {}, naming=naming)
    reports = tuple(writer.write_records(p, [(b"k", f"b{batch.seq}-p{p}".encode())]) for p in (0, 1))
    return KafkaCommittable("EXACTLY_ONCE", pipe.config.bootstrap_servers, output.topic, reports,
                            naming.slot(batch.seq) if naming is not None else None)


def prepare(pipe: Pipe, batch: Batch, pooled: bool = True) -> KafkaCommittable:
    claimed = pipe.claim(batch.id)
    committable = stage(pipe, claimed, pooled)
    if pooled:
        pipe.coordinator.prepare(claimed, committable, 2, 2)
    else:  # the first release's handles: unversioned, no id_slot (tests/fixtures/handles/kafka-v1.json)
        handles = committable.write_handles()
        assert "id_slot" not in handles
        pipe.ledger.mark_prepared(claimed.id, claimed.epoch, {**handles, "records": 2}, 2, 2)
    return committable


def cli(capsys, *argv: str) -> tuple[int, list[dict]]:
    capsys.readouterr()
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else []


def ids_on_coordinator(kafka, prefix: str) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        return set(probe.matching_transactions(admin, KafkaSettings(kafka.bootstrap_servers),
                                               rf"{prefix}-\d+-\d+"))
    finally:
        admin.close()


def test_pooled_ids_reuse_a_slot_after_its_batch_ended_and_wait_while_it_is_open_across_an_upgrade(kafka, tmp_path):
    pipe = new_pipe(kafka, tmp_path, transactional_id_slots=2)
    prefix, servers = pipe.config.pipeline_id, kafka.bootstrap_servers
    # The previous release: batch 1 PREPARED under per-batch ids, batch 2 PLANNED with a zombie's open transaction.
    first = planted(pipe, 1)
    staged = prepare(pipe, first, pooled=False)
    assert [r.transactional_id for r in staged.reports] == [f"{prefix}-1-0", f"{prefix}-1-1"]
    second = planted(pipe, 2)
    zombie = write_and_pre_commit(servers, f"{prefix}-2-0", pipe.config.sink["topic"], [b"zombie"])

    # This release: recovery commits batch 1 from its old handles; the abort of batch 2 fences its old ids.
    coordinator = pipe.new_coordinator()
    coordinator.recover()
    assert coordinator.recovered == [first.id]
    pipe.abort(second.id)
    assert settled_transaction_state(servers, zombie.transactional_id) in FENCED

    # Batch 3 takes slot 1, whose ids batch 1 used and ended; batch 4 (slot 0) stays open, so batch 6 waits.
    third = planted(pipe, 3)
    staged = prepare(pipe, third)
    assert [r.transactional_id for r in staged.reports] == [f"{prefix}-1-0", f"{prefix}-1-1"]
    assert pipe.ledger.get_batch(third.id).handles["id_slot"] == 1
    pipe.commit(third.id)
    fourth, fifth, sixth = (planted(pipe, seq) for seq in (4, 5, 6))
    with pytest.raises(SinkError) as waiting:
        stage(pipe, pipe.claim(sixth.id))
    assert waiting.value.retriable and "batch 4 (PLANNED" in str(waiting.value)
    pipe.abort(fourth.id)
    pipe.abort(fifth.id)
    prepare(pipe, pipe.ledger.get_batch(sixth.id))
    pipe.commit(sixth.id)

    assert sorted(read_all(servers, pipe.config.sink["topic"])) == sorted(
        f"b{seq}-p{p}" for seq in (1, 3, 6) for p in (0, 1))
    # Slot 0's and slot 1's ids, and the old naming's batch-2 id only: nothing new per batch.
    assert ids_on_coordinator(kafka, prefix) == {f"{prefix}-{n}-{p}" for n in (0, 1) for p in (0, 1)} | \
        {f"{prefix}-2-0"}


def test_transactions_list_and_abort_spare_a_prepared_batch_unless_forced(kafka, tmp_path, capsys):
    pipe = new_pipe(kafka, tmp_path)
    prefix, servers = pipe.config.pipeline_id, kafka.bootstrap_servers
    ledger = ["--ledger-url", str(pipe.ledger.engine.url)]
    prepared = prepare(pipe, planted(pipe, 1))
    stray = write_and_pre_commit(servers, f"{prefix}-3-0", pipe.config.sink["topic"], [b"stray"])

    code, rows = cli(capsys, *ledger, "transactions", "list", prefix)
    assert code == 1
    shown = {r["transactional_id"]: r for r in rows}
    assert set(shown) == {f"{prefix}-1-0", f"{prefix}-1-1", stray.transactional_id}
    for report in prepared.reports:
        row = shown[report.transactional_id]
        assert (row["kind"], row["state"], row["batch"]) == ("open", "Ongoing", "batch 1 (PREPARED)")
        assert (row["producer_id"], row["epoch"]) == (report.transaction.producer_id, report.transaction.epoch)
        assert row["age_s"] is not None and row["age_s"] >= 0
    assert shown[stray.transactional_id]["batch"] == "none"

    code, rows = cli(capsys, *ledger, "transactions", "abort", prefix)
    assert code == 3  # the stray one ended, the PREPARED batch's refused
    assert {r["transactional_id"]: r["outcome"] for r in rows} == {
        stray.transactional_id: "ended", f"{prefix}-1-0": "refused", f"{prefix}-1-1": "refused"}
    assert settled_transaction_state(servers, stray.transactional_id) in FENCED
    assert settled_transaction_state(servers, f"{prefix}-1-0") == "Ongoing"

    code, rows = cli(capsys, *ledger, "transactions", "abort", prefix, "--id", f"{prefix}-1-0", "--force")
    assert code == 0 and [(r["transactional_id"], r["outcome"]) for r in rows] == [(f"{prefix}-1-0", "ended")]
    assert settled_transaction_state(servers, f"{prefix}-1-0") in FENCED
    code, rows = cli(capsys, *ledger, "transactions", "abort", prefix, "--id", "no-such-id")
    assert code == 2
    code, rows = cli(capsys, *ledger, "transactions", "abort", prefix, "--force")
    assert code == 0
    code, rows = cli(capsys, *ledger, "transactions", "list", prefix)
    assert (code, rows) == (0, [])


def test_transactions_without_a_ledger_by_prefix(kafka, tmp_path, capsys):
    prefix = f"lost-{uuid.uuid4().hex[:8]}"
    topic = f"{prefix}-out"
    create_topic(kafka.bootstrap_servers, topic, partitions=1)
    open_one = write_and_pre_commit(kafka.bootstrap_servers, f"{prefix}-0-0", topic, [b"left-open"])
    write_and_pre_commit(kafka.bootstrap_servers, f"{prefix}x-0-0", topic, [b"another-prefix"])
    where = ["--prefix", prefix, "--bootstrap-servers", kafka.bootstrap_servers, "--topic", topic]

    code, rows = cli(capsys, "transactions", "list", *where)
    assert code == 1 and [(r["transactional_id"], r["batch"]) for r in rows] == [(open_one.transactional_id, "none")]
    code, rows = cli(capsys, "transactions", "abort", *where)
    assert code == 0 and [(r["action"], r["outcome"]) for r in rows] == [("fence", "ended")]
    code, rows = cli(capsys, "transactions", "list", *where)
    assert (code, rows) == (0, [])
    assert settled_transaction_state(kafka.bootstrap_servers, f"{prefix}x-0-0") == "Ongoing"  # not ours: untouched
