"""The ledger's compare-and-set: every transition guarded by state and epoch (SQLite file)."""

from __future__ import annotations

import threading

import pytest

from airflow_exactly_once.core.errors import FencedError, IllegalTransitionError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.states import TRANSITIONS, BatchState, check_transition
from tests.harness import open_ledger


def test_transition_table_is_the_designed_one():
    assert TRANSITIONS[BatchState.PLANNED] == {BatchState.PREPARED, BatchState.ABORTED}
    assert TRANSITIONS[BatchState.PREPARED] == {BatchState.COMMITTED, BatchState.ABORTED}
    # Committed output is only ever withdrawn on purpose: a rewind or an interval replacement.
    assert TRANSITIONS[BatchState.COMMITTED] == {BatchState.RETRACTED}
    assert not TRANSITIONS[BatchState.ABORTED]
    with pytest.raises(IllegalTransitionError):
        check_transition(BatchState.PLANNED, BatchState.COMMITTED)
    with pytest.raises(IllegalTransitionError):
        check_transition(BatchState.COMMITTED, BatchState.ABORTED)


def test_every_transition_is_guarded_by_state_and_epoch(tmp_path):
    ledger = open_ledger(tmp_path / "ledger.db")
    ledger.ensure_pipeline("p", "f", {})
    batch = ledger.create_batch("p", "run1", [OffsetRange("t", 0, 0, 5)], expected_epoch=0)
    assert (batch.seq, batch.epoch, batch.state) == (1, 1, BatchState.PLANNED)
    with pytest.raises(FencedError):  # a stale epoch cannot create a batch
        ledger.create_batch("p", "run2", [], expected_epoch=0)
    first = ledger.claim(batch.id)
    second = ledger.claim(batch.id)  # a newer attempt fences the first
    with pytest.raises(FencedError, match="epoch"):
        ledger.mark_prepared(batch.id, first.epoch, {}, 5, 5)
    ledger.mark_prepared(batch.id, second.epoch, {"h": 1}, 5, 5)
    with pytest.raises(FencedError):
        ledger.mark_aborted(batch.id, "too late")  # PREPARED is not abortable by a plain abort
    assert ledger.mark_committed(batch.id) is True
    assert ledger.mark_committed(batch.id) is False  # idempotent
    assert ledger.committed_positions("p") == {("t", 0): 5}


def test_superseding_a_batch_that_became_prepared_is_retriable(tmp_path):
    ledger = open_ledger(tmp_path / "ledger.db")
    ledger.ensure_pipeline("p", "f", {})
    a = ledger.create_batch("p", "a", [OffsetRange("t", 0, 0, 5)], expected_epoch=0)
    claimed = ledger.claim(a.id)
    ledger.mark_prepared(a.id, claimed.epoch, {}, 5, 5)
    with pytest.raises(FencedError) as raced:
        ledger.create_batch("p", "b", [OffsetRange("t", 0, 0, 5)], expected_epoch=claimed.epoch, supersede=[a.seq])
    assert raced.value.retriable and "PREPARED" in str(raced.value)
    assert ledger.list_batches("p") == [ledger.get_batch(a.id)]  # nothing recorded, the epoch unchanged
    assert ledger.pipeline("p")["epoch"] == claimed.epoch


def test_concurrent_planners_one_wins(tmp_path):
    url = f"sqlite:///{tmp_path / 'race.db'}"
    Ledger(url).ensure_pipeline("p", "f", {})
    results: list[str] = []
    barrier = threading.Barrier(6)

    def plan(i: int) -> None:
        ledger = Ledger(url)
        barrier.wait()
        try:
            ledger.create_batch("p", f"run{i}", [OffsetRange("t", 0, 0, 5)], expected_epoch=0)
            results.append("won")
        except FencedError:
            results.append("fenced")

    threads = [threading.Thread(target=plan, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["fenced"] * 5 + ["won"]
    assert len(Ledger(url).list_batches("p")) == 1
