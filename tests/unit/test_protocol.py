"""The protocol on a real ledger (SQLite file) with a fake source and a file sink that needs no Spark.

The guarantees themselves are proven end to end against the real components in tests/system.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from airflow_exactly_once.core.errors import FencedError, SinkError, TransactionLostError
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.states import BatchState
from tests.harness import FakeSource, MarkerWriter, Pipe, open_ledger, pipeline_config


@pytest.fixture
def pipe(tmp_path) -> Pipe:
    source = FakeSource({("t", 0): 10, ("t", 1): 7})
    config = pipeline_config("p", ["t"], {"type": "parquet", "path": str(tmp_path / "out")},
                             max_records_per_partition=5)
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: source, writer_factory=MarkerWriter.of)
    pipe.fake_source = source
    return pipe


def test_batches_tile_and_offsets_advance_only_after_commit(pipe):
    first = pipe.plan("r1").batch
    assert [r.size for r in first.ranges] == [5, 5]
    pipe.write(first.id)
    assert pipe.ledger.committed_positions("p") == {("t", 0): 0, ("t", 1): 0}  # PREPARED is not committed
    pipe.commit(first.id)
    assert pipe.ledger.committed_positions("p") == {("t", 0): 5, ("t", 1): 5}
    second = pipe.plan("r2").batch
    assert second.ranges == (OffsetRange("t", 0, 5, 10), OffsetRange("t", 1, 5, 7))
    assert Path(pipe.sink.layout.final_dir(first)).exists()


def test_retry_replays_the_same_range_even_with_new_data(pipe):
    planned = pipe.plan("r1")
    pipe.fake_source.ends[("t", 0)] = 100
    again = pipe.plan("r1")
    assert again.action == "replay" and again.batch.ranges == planned.batch.ranges


def test_recovery_first_commits_a_prepared_batch_before_planning(pipe):
    first = pipe.plan("r1").batch
    pipe.write(first.id)  # notify_complete never ran
    outcome = pipe.plan("r2")
    assert pipe.state(first.id) is BatchState.COMMITTED
    assert outcome.batch.ranges[0].start == 5


def test_notify_complete_twice_and_after_a_crash_halfway(pipe):
    batch = pipe.plan("r1").batch
    prepared = pipe.write(batch.id)
    pipe.sink.commit(prepared, pipe.sink.committable(prepared.handles))  # the task died right after this
    assert "already published" in pipe.commit(batch.id)
    assert "already committed" in pipe.commit(batch.id)
    assert len(list(Path(pipe.sink.layout.root).glob("batch_seq=*"))) == 1


def test_lost_output_aborts_the_batch_and_frees_its_range(pipe):
    batch = pipe.plan("r1").batch
    prepared = pipe.write(batch.id)
    shutil.rmtree(prepared.handles["staging"])
    with pytest.raises(TransactionLostError, match="processed again"):
        pipe.commit(batch.id)
    assert pipe.state(batch.id) is BatchState.ABORTED
    assert pipe.plan("r2").batch.ranges == batch.ranges


def test_abort_releases_the_range_and_a_cleared_run_replays_it_exactly(pipe):
    batch = pipe.plan("r1").batch
    pipe.stage(None, pipe.claim(batch.id))  # a write attempt that died after staging
    pipe.abort(batch.id, "write failed")
    assert not list((Path(pipe.sink.layout.root) / "_staging").iterdir())
    with pytest.raises(SinkError, match="aborted"):
        pipe.commit(batch.id)
    pipe.fake_source.ends[("t", 0)] = 100
    replay = pipe.plan("r1")  # the run is cleared in Airflow: same range, never newer data
    assert replay.action == "replanned" and replay.batch.ranges == batch.ranges


def test_a_later_plan_supersedes_and_fences_an_earlier_writer(pipe):
    early = pipe.plan("a").batch
    claimed = pipe.claim(early.id)
    late = pipe.plan("b").batch
    assert late.ranges == early.ranges
    assert pipe.state(early.id) is BatchState.ABORTED
    staged = pipe.stage(None, claimed)
    with pytest.raises(FencedError):
        pipe.coordinator.prepare(claimed, staged, 0, 0)
    assert not Path(staged.staging).exists()  # the fenced writer cleaned up after itself


def test_a_write_finishing_while_another_run_plans_makes_it_plan_again(pipe, monkeypatch):
    """Run B read the epoch and the in-flight batches; A's write then marked A's batch PREPARED before B
    recorded its own batch (which supersedes A's PLANNED one). B must plan again, recovering A first,
    instead of failing for good (see tests/integration/test_ledger_backends.py for both backends)."""
    a = pipe.plan("a").batch
    claimed = pipe.claim(a.id)
    staged = pipe.stage(None, claimed)
    real_create, raced = pipe.ledger.create_batch, []

    def create_after_a_prepared(*args, **kwargs):
        if not raced:
            raced.append(pipe.coordinator.prepare(claimed, staged, 10, 10))
        return real_create(*args, **kwargs)

    monkeypatch.setattr(pipe.ledger, "create_batch", create_after_a_prepared)
    outcome = pipe.plan("b")
    assert raced and pipe.state(a.id) is BatchState.COMMITTED  # recovered first
    assert outcome.action == "planned" and outcome.batch.ranges[0].start == a.ranges[0].end


def staged_attempts(pipe, batch) -> list[str]:
    folder = pipe.sink.layout.root / "_staging"
    return sorted(p.name for p in folder.glob(f"batch-{batch.seq:09d}-*")) if folder.exists() else []


def test_abort_stops_the_attempts_first_and_a_failed_stop_leaves_the_release_to_recovery(pipe):
    """abort marks the batch ABORTED (the fence), stops its attempts, then removes what they staged;
    if they cannot be stopped, nothing is cleaned up under them and the next plan's recovery does it."""
    batch = pipe.plan("r1").batch
    pipe.stage(None, pipe.claim(batch.id))  # an attempt staged its output, then its task died
    calls: list[tuple[int, list[str]]] = []

    def unreachable(b):
        calls.append((b.seq, staged_attempts(pipe, b)))
        raise SinkError("the server that runs the attempt cannot be reached", retriable=True)

    pipe.coordinator.stop_attempts = unreachable
    with pytest.raises(SinkError, match="cannot be reached"):
        pipe.abort(batch.id)
    assert pipe.state(batch.id) is BatchState.ABORTED  # the ledger fences the attempt already
    assert [b.seq for b in pipe.ledger.pending_releases("p")] == [batch.seq]
    assert staged_attempts(pipe, batch) == ["batch-000000001-e2"]  # not cleaned under a running job

    pipe.coordinator.stop_attempts = lambda b: calls.append((b.seq, staged_attempts(pipe, b))) or "stopped"
    outcome = pipe.plan("r2")  # recovery finishes the release before anything is planned
    assert calls == [(1, ["batch-000000001-e2"]), (1, ["batch-000000001-e2"])]  # stopped before removing
    assert staged_attempts(pipe, batch) == [] and pipe.ledger.pending_releases("p") == []
    assert outcome.batch.ranges == batch.ranges  # the range is processed again
    assert "already ABORTED and released" in pipe.abort(batch.id)


def test_a_superseded_batch_is_released_by_the_run_that_took_it_over(pipe):
    first = pipe.plan("r1").batch
    pipe.stage(None, pipe.claim(first.id))  # its write died; no abort task ran
    second = pipe.plan("r2").batch
    assert pipe.state(first.id) is BatchState.ABORTED and second.ranges == first.ranges
    assert staged_attempts(pipe, first) == [] and pipe.ledger.pending_releases("p") == []


def test_lost_output_is_released_before_the_batch_is_aborted(pipe):
    batch = pipe.plan("r1").batch
    prepared = pipe.write(batch.id)
    seen = []
    original = pipe.sink.abort

    def abort(b, committable):
        seen.append((committable, pipe.state(b.id)))
        return original(b, committable)

    pipe.sink.abort = abort
    shutil.rmtree(pipe.sink.committable(prepared.handles).staging)
    with pytest.raises(TransactionLostError):
        pipe.commit(batch.id)
    assert seen == [(pipe.sink.committable(prepared.handles), BatchState.PREPARED)]
    assert pipe.state(batch.id) is BatchState.ABORTED and pipe.ledger.pending_releases("p") == []


@pytest.mark.parametrize("returning", [True, False])
def test_the_batches_that_writes_return_are_the_batches_the_ledger_reads(pipe, monkeypatch, returning):
    """create_batch, claim and mark_prepared build their Batch from the row their statement returned (RETURNING)
    rather than reading it again; a database without RETURNING (SQLite before 3.35) reads it. Either way the
    caller gets exactly what a later read finds."""
    dialect = pipe.ledger.engine.dialect
    if not returning:
        monkeypatch.setattr(dialect, "insert_returning", False)
        monkeypatch.setattr(dialect, "update_returning", False)
    assert dialect.insert_returning is returning and dialect.update_returning is returning
    planned = pipe.plan("r1").batch
    assert planned == pipe.ledger.get_batch(planned.id) and len(planned.ranges) == 2
    claimed = pipe.claim(planned.id)
    assert claimed == pipe.ledger.get_batch(planned.id) and claimed.epoch > planned.epoch
    prepared = pipe.coordinator.prepare(claimed, pipe.stage(None, claimed), 10, 10, details={"note": 1})
    assert prepared == pipe.ledger.get_batch(planned.id) and prepared.details == {"note": 1}
    assert prepared.state is BatchState.PREPARED and prepared.ranges == planned.ranges
    pipe.commit(planned.id)
    assert pipe.state(planned.id) is BatchState.COMMITTED
    replanned = pipe.plan("r2").batch
    assert replanned == pipe.ledger.get_batch(replanned.id) and replanned.ranges[0].start == 5
    written = pipe.write(replanned.id)  # prepared without details: its ranges are read with its row
    assert written == pipe.ledger.get_batch(replanned.id) and written.ranges == replanned.ranges
