"""Pooled transactional ids: their names, which earlier batches hold a slot, a prefix two pipelines share, and
the `transactions abort` rules for hanging transactions."""

from __future__ import annotations

import re

import pytest

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError, SinkError
from airflow_exactly_once.core.model import Batch, OffsetRange
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.sinks import create_committer
from airflow_exactly_once.sinks.kafka import hanging, lingering
from airflow_exactly_once.sinks.kafka.committable import KafkaCommittable
from airflow_exactly_once.sinks.kafka.lingering import _why_not
from airflow_exactly_once.sinks.kafka.transactional_ids import IdNaming, prefix_users, refuse_changed_slots
from tests.harness import open_ledger


def test_pooled_ids_are_bounded_by_slots_and_the_per_batch_naming_is_kept_on_request():
    pooled = IdNaming("orders", slots=3)
    assert {pooled.transactional_id(seq, p) for seq in range(1, 1001) for p in range(4)} == \
        {f"orders-{slot}-{p}" for slot in range(3) for p in range(4)}
    per_batch = IdNaming("orders", "per_batch")
    assert per_batch.transactional_id(1000, 2) == "orders-1000-2" and per_batch.slot(1000) is None


def test_a_batch_pattern_covers_its_slot_and_the_ids_an_earlier_release_gave_it():
    pattern = re.compile(IdNaming("p.x", slots=4).batch_pattern(6))
    assert all(pattern.fullmatch(t) for t in ("p.x-2-0", "p.x-2-11", "p.x-6-0"))
    assert not any(pattern.fullmatch(t) for t in ("p.x-3-0", "pax-2-0", "p.x-26-0", "p.x-2-0-1"))
    assert re.fullmatch(IdNaming("p", "per_batch").batch_pattern(6), "p-6-1")
    assert not re.fullmatch(IdNaming("p", "per_batch").batch_pattern(6), "p-2-1")


@pytest.mark.parametrize("slots", [1, 0, "4", True])
def test_too_few_slots_or_an_unknown_naming_is_refused(slots):
    with pytest.raises(ConfigurationError, match="transactional_id_slots"):
        IdNaming("p", slots=slots)
    with pytest.raises(ConfigurationError, match="transactional_ids='random'"):
        IdNaming("p", "random")


def test_a_batch_waits_while_an_earlier_batch_of_its_slot_is_open_or_unreleased(tmp_path):
    ledger = open_ledger(tmp_path / "ledger.db")
    ledger.ensure_pipeline("p", "f", {})
    made = [ledger.create_batch("p", f"run-{i}", [OffsetRange("t", 0, 10 * i, 10 * i + 10)],
                                expected_epoch=ledger.pipeline("p")["epoch"]) for i in range(1, 8)]
    naming = IdNaming("p", slots=3)
    batch = {b.seq: b for b in made}
    # 1, 4 and 7 share slot 1: 4 waits for 1 (PLANNED), 7 for both; 2 and 5 (slot 2) likewise.
    assert [b.seq for b in naming.slot_holders(batch[7], ledger)] == [1, 4]
    ledger.mark_prepared(batch[1].id, batch[1].epoch, {"records": 0}, 0, 0)
    assert [b.seq for b in naming.slot_holders(batch[4], ledger)] == [1]  # PREPARED: its transactions are open
    ledger.mark_committed(batch[1].id)
    assert naming.slot_holders(batch[4], ledger) == []  # ended for good: 4 may write
    ledger.mark_aborted(batch[2].id, "test", release_pending=True)
    with pytest.raises(SinkError) as waiting:
        naming.ensure_free(batch[5], ledger)  # ABORTED but not released: its ids are not fenced yet
    assert waiting.value.retriable and "batch 2 (ABORTED" in str(waiting.value)
    assert "transactional_id_slots" in str(waiting.value)
    assert naming.slot_holders(batch[3], ledger) == []  # slot 0: nothing before it
    assert [b.seq for b in naming.later_holders(batch[1], ledger)] == [4, 7]
    naming.ensure_free(batch[5], None)  # a sink used without a ledger: nothing to check
    assert IdNaming("p", "per_batch").slot_holders(batch[7], ledger) == []


def test_the_slot_travels_in_the_handles_and_old_handles_have_none():
    committable = KafkaCommittable("EXACTLY_ONCE", "b:9092", "out", (), 3)
    assert committable.write_handles()["id_slot"] == 3
    assert KafkaCommittable.from_handles(committable.to_handles()) == committable
    old = KafkaCommittable.from_handles({"guarantee": "EXACTLY_ONCE", "bootstrap_servers": "b:9092", "topic": "out",
                                         "writers": []})
    assert old.id_slot is None


def config(pipeline_id: str, **sink) -> dict:
    return {"pipeline_id": pipeline_id, "sink": {"type": "kafka", "topic": "out", **sink}}


def test_a_prefix_another_pipeline_of_the_ledger_uses_is_refused_at_plan(tmp_path):
    ledger = open_ledger(tmp_path / "ledger.db")
    ledger.ensure_pipeline("orders", "f1", config("orders"))
    ledger.ensure_pipeline("billing", "f2", config("billing", transactional_id_prefix="shared"))
    ledger.ensure_pipeline("audit", "f3", {"pipeline_id": "audit", "sink": {"type": "parquet", "path": "/x"},
                                            "dead_letter": {"type": "kafka", "topic": "dl"}})
    assert prefix_users("orders", ledger.list_pipelines(), "new") == ["orders"]
    assert prefix_users("shared", ledger.list_pipelines(), "billing") == []  # its own
    assert prefix_users("audit~dead-letter", ledger.list_pipelines(), "new") == ["audit"]

    pipeline = PipelineConfig(pipeline_id="new", topics=["in"], bootstrap_servers="127.0.0.1:1",
                              sink={"type": "kafka", "topic": "out", "transactional_id_prefix": "shared"})
    committer = create_committer(pipeline.sink).bind(pipeline, None, ledger)
    with pytest.raises(ConfigurationError) as refused:
        committer.check("new")  # refused before any broker is asked
    assert "'shared' is also used by pipeline(s) billing" in str(refused.value) and not refused.value.retriable


def hanging_txn(outcome: hanging.Outcome, batch: Batch | None = None) -> lingering.HangingTxn:
    txn = hanging.OpenTransaction("out", 0, 42, 3, 1, 100)
    return lingering.HangingTxn(hanging.Hanging(txn, hanging.CoordinatorView("p-0-0", "Empty", 42, 3), outcome), batch)


def test_the_cli_ends_a_hanging_transaction_without_a_ledger_only_when_forced_and_never_over_a_commit():
    """The `transactions abort` rules beyond the sweep's (which need the ledger's owner of the producer id)."""
    def never(*_):
        raise AssertionError("no record is looked up without an owner")

    lost_ledger = lingering.PipelineRecord()
    unknown = hanging_txn(hanging.Outcome.UNKNOWN)
    assert "add --force" in _why_not(unknown, lost_ledger, frozenset(), never, force=False)
    assert _why_not(unknown, lost_ledger, frozenset(), never, force=True) is None
    committed = hanging_txn(hanging.Outcome.COMMITTED)
    assert "committed" in _why_not(committed, lost_ledger, frozenset(), never, force=True)
    prepared = Batch("p", 7, "run", BatchState.PREPARED, 1, ())
    owned = lingering.PipelineRecord({42: hanging.Owner(7, False, ())}, {7: prepared})
    aborted = hanging_txn(hanging.Outcome.ABORTED, prepared)
    assert "batch 7 (PREPARED) is pre-committed" in _why_not(aborted, owned, frozenset(), never, force=False)
    assert _why_not(aborted, owned, frozenset(), never, force=True) is None  # the sweep's rule: aborted, not committed


# -- a changed transactional_id_slots -------------------------------------------------------------------------


def slot_ledger(tmp_path, count: int):
    """A ledger with `count` PLANNED batches of pipeline "p" (seqs 1..count)."""
    ledger = open_ledger(tmp_path / "ledger.db")
    ledger.ensure_pipeline("p", "f", config("p"))
    return ledger, [ledger.create_batch("p", f"run-{i}", [OffsetRange("t", 0, 10 * i, 10 * i + 10)],
                                        expected_epoch=ledger.pipeline("p")["epoch"]) for i in range(1, count + 1)]


def prepare(ledger, batch: Batch, slot: int | None, slots: int | None) -> None:
    handles = KafkaCommittable("EXACTLY_ONCE", "b:9092", "out", (), slot, slots).to_handles()
    ledger.mark_prepared(batch.id, batch.epoch, handles, 0, 0)


def bound_committer(ledger, slots: int):
    pipeline = PipelineConfig(pipeline_id="p", topics=["in"], bootstrap_servers="127.0.0.1:1",
                              sink={"type": "kafka", "topic": "out", "transactional_id_slots": slots})
    committer = create_committer(pipeline.sink)
    history = lambda: [(b, c) for b in ledger.list_batches("p")  # noqa: E731 - as core.protocol binds it
                       if (c := committer.committable(b.handles)) is not None]
    return committer.bind(pipeline, history, ledger)


def test_the_slot_count_travels_in_the_handles():
    committable = KafkaCommittable("EXACTLY_ONCE", "b:9092", "out", (), 3, 8)
    assert committable.write_handles()["id_slots"] == 8
    assert KafkaCommittable.from_handles(committable.to_handles()) == committable


def test_a_slot_count_changed_while_a_prepared_batch_is_open_is_refused_at_plan(tmp_path):
    ledger, (first, second) = slot_ledger(tmp_path, 2)
    prepare(ledger, first, 1, 4)
    ledger.mark_committed(first.id)
    prepare(ledger, second, 2, 4)  # its transactions are open: ids p-2-*
    with pytest.raises(ConfigurationError) as refused:
        bound_committer(ledger, 8).check("p")  # refused before any broker is asked
    message = str(refused.value)
    assert "transactional_id_slots=8" in message and "batch 2 (PREPARED; its ids named with 4 slots)" in message
    assert "go back to transactional_id_slots=4" in message and "Finish or abort the open batch first" in message
    assert not refused.value.retriable
    refuse_changed_slots(IdNaming("p", slots=4), "p", ledger, lambda: bound_committer(ledger, 4)._used_namings())


def test_a_planned_batch_is_judged_by_the_naming_the_newest_batch_recorded(tmp_path):
    ledger, (first, second, third) = slot_ledger(tmp_path, 3)
    prepare(ledger, first, 1, 4)
    ledger.mark_committed(first.id)
    prepare(ledger, second, 2, 4)
    ledger.mark_committed(second.id)  # batch 3 stays PLANNED: its write may have opened p-3-* under 4 slots
    used = bound_committer(ledger, 8)._used_namings
    with pytest.raises(ConfigurationError, match=r"batch 3 \(PLANNED; its ids named with 4 slots, as batch 2 "):
        refuse_changed_slots(IdNaming("p", slots=8), "p", ledger, used)
    refuse_changed_slots(IdNaming("p", slots=4), "p", ledger, used)


def test_a_slot_count_changed_with_no_batch_open_is_harmless(tmp_path):
    ledger, (first, second) = slot_ledger(tmp_path, 2)
    prepare(ledger, first, 1, 4)
    ledger.mark_committed(first.id)
    ledger.mark_aborted(second.id, "test")  # aborted and released: its ids are fenced
    refuse_changed_slots(IdNaming("p", slots=8), "p", ledger, lambda: pytest.fail("no open batch: not read"))
    ledger.mark_aborted(  # an aborted batch whose release is pending still holds its ids
        ledger.create_batch("p", "run-3", [OffsetRange("t", 0, 30, 40)], expected_epoch=ledger.pipeline("p")["epoch"]
                            ).id, "test", release_pending=True)
    with pytest.raises(ConfigurationError, match=r"batch 3 \(ABORTED"):
        refuse_changed_slots(IdNaming("p", slots=8), "p", ledger, bound_committer(ledger, 8)._used_namings)


def test_handles_without_the_slot_count_show_a_change_only_by_a_slot_that_disagrees(tmp_path):
    ledger, (first, _, third) = slot_ledger(tmp_path, 3)
    prepare(ledger, first, None, None)  # per-batch ids (the first releases): the upgrade to pooling stays allowed
    prepare(ledger, third, 3, None)  # a release that recorded the slot only: 3 of 4 slots
    used = bound_committer(ledger, 4)._used_namings
    refuse_changed_slots(IdNaming("p", slots=5), "p", ledger, used)  # 3 mod 5 = 3: no sign of a change
    with pytest.raises(ConfigurationError, match=r"batch 3 \(PREPARED; its ids named with slot 3 for batch 3\)"):
        refuse_changed_slots(IdNaming("p", slots=2), "p", ledger, used)  # 3 mod 2 = 1: named otherwise
