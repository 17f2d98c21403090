"""Pure logic of the protocol core: states, planner, ledger (SQLite file), coordinator with fakes.

No Kafka, Spark or Airflow here; the guarantees themselves are proven end to end in
test_pipeline_parquet.py against the real components.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from airflow_exactly_once.core.config import PipelineConfig, resolve_transform
from airflow_exactly_once.core.errors import (
    ConfigurationError,
    DataLossError,
    FencedError,
    IllegalTransitionError,
    SinkError,
    TransactionLostError,
)
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import BatchId, OffsetRange
from airflow_exactly_once.core.planner import plan_ranges
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.states import TRANSITIONS, BatchState, check_transition
from airflow_exactly_once.sinks.parquet import ParquetSink


def config(**overrides) -> PipelineConfig:
    values = dict(pipeline_id="p", topics=["t"], sink={"type": "parquet", "path": "/tmp/x"},
                  bootstrap_servers="127.0.0.1:9092")
    values.update(overrides)
    return PipelineConfig(**values).validate()


class FakeSource:
    """Answers like Kafka would for a topic whose partitions hold `ends` offsets."""

    def __init__(self, ends: dict[tuple[str, int], int], starts: dict[tuple[str, int], int] | None = None):
        self.ends = ends
        self.starts = starts or {tp: 0 for tp in ends}

    def partitions(self, topics):
        return [tp for tp in self.ends if tp[0] in topics]

    def log_start_offsets(self, tps):
        return {tp: self.starts[tp] for tp in tps}

    def end_offsets(self, tps):
        return {tp: self.ends[tp] for tp in tps}

    def close(self):
        pass


class FakeSink(ParquetSink):
    """A Parquet sink whose `prepare` writes a marker file instead of running Spark."""

    def prepare(self, data, batch, attempt):
        staging = self.staging_dir(batch, attempt)
        staging.mkdir(parents=True)
        (staging / "part-0.parquet").write_text(repr(batch.ranges))
        return {"staging": str(staging), "final": str(self.final_dir(batch)), "files": ["part-0.parquet"]}


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.create_schema()
    return ledger


@pytest.fixture
def coordinator(tmp_path, ledger):
    source = FakeSource({("t", 0): 10, ("t", 1): 7})
    cfg = config(sink={"type": "parquet", "path": str(tmp_path / "out")}, max_records_per_partition=5)
    return BatchCoordinator(cfg, ledger, FakeSink(cfg.sink), lambda: source), source


def write(coordinator: BatchCoordinator, batch_id: BatchId):
    batch = coordinator.begin_write(batch_id)
    handles = coordinator.sink.prepare(None, batch, f"e{batch.epoch}")
    return coordinator.finish_write(batch, handles, batch.offset_span, batch.offset_span)


# -- states -----------------------------------------------------------------------

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


# -- planner ----------------------------------------------------------------------

def test_planner_startup_modes_and_bounds():
    tps = [("t", 0), ("t", 1)]
    starts, ends = {("t", 0): 2, ("t", 1): 0}, {("t", 0): 50, ("t", 1): 3}
    earliest = plan_ranges(config(max_records_per_partition=10), {}, tps, starts, ends)
    assert earliest.ranges == [OffsetRange("t", 0, 2, 12), OffsetRange("t", 1, 0, 3)]
    assert earliest.new_partitions == {("t", 0): (2, "startup mode earliest"), ("t", 1): (0, "startup mode earliest")}
    latest = plan_ranges(config(startup_mode="latest"), {}, tps, starts, ends)
    assert latest.is_empty and latest.new_partitions[("t", 0)][0] == 50


def test_planner_continues_from_committed_and_picks_up_new_partitions():
    plan = plan_ranges(config(new_partition_start="latest"), {("t", 0): 40}, [("t", 0), ("t", 1)],
                       {("t", 0): 0, ("t", 1): 0}, {("t", 0): 50, ("t", 1): 9})
    assert plan.ranges == [OffsetRange("t", 0, 40, 50), OffsetRange("t", 1, 9, 9)]
    assert plan.new_partitions == {("t", 1): (9, "new partition, latest")}


@pytest.mark.parametrize("position, log_start, end", [(5, 20, 30), (80, 0, 10)])
def test_planner_data_loss_fails_loudly_unless_skip(position, log_start, end):
    args = ({("t", 0): position}, [("t", 0)], {("t", 0): log_start}, {("t", 0): end})
    with pytest.raises(DataLossError, match="data_loss_policy='skip'"):
        plan_ranges(config(), *args)
    plan = plan_ranges(config(data_loss_policy="skip"), *args)
    assert plan.ranges == [OffsetRange("t", 0, log_start, end)] and len(plan.skipped) == 1


def test_planner_vanished_partition_is_data_loss():
    with pytest.raises(DataLossError, match="no longer exists"):
        plan_ranges(config(), {("t", 0): 5, ("t", 1): 5}, [("t", 0)], {("t", 0): 0}, {("t", 0): 9})


# -- config -----------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    ({"pipeline_id": "has space"}, "pipeline_id"),
    ({"topics": []}, "topics"),
    ({"bootstrap_servers": ""}, "bootstrap"),
    ({"startup_mode": "beginning"}, "startup_mode"),
    ({"max_records_per_partition": 0}, "max_records_per_partition"),
    ({"sink": {"path": "/x"}}, "sink must be a dict with a 'type'"),
])
def test_bad_configuration_names_the_setting(overrides, message):
    with pytest.raises(ConfigurationError, match=message):
        config(**overrides)


def test_transform_references():
    assert resolve_transform("json:dumps")([1]) == "[1]"
    with pytest.raises(ConfigurationError, match="cannot be imported"):
        resolve_transform("no_such_module_xyz:f")
    with pytest.raises(ConfigurationError, match="has no function"):
        resolve_transform("json:no_such_function")
    with pytest.raises(ConfigurationError, match="must look like"):
        resolve_transform("json.dumps")


def test_parquet_sink_rejects_unsafe_paths():
    with pytest.raises(ConfigurationError, match="absolute"):
        ParquetSink({"type": "parquet", "path": "relative/out"})
    with pytest.raises(ConfigurationError, match="atomic rename"):
        ParquetSink({"type": "parquet", "path": "s3a://bucket/out"})


# -- ledger -----------------------------------------------------------------------

def test_ledger_guards_every_transition_by_state_and_epoch(ledger):
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


def test_ledger_concurrent_planners_one_wins(tmp_path):
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


# -- coordinator with a fake source and a file sink -----------------------------------

def test_batches_tile_and_offsets_advance_only_after_commit(coordinator):
    coord, _ = coordinator
    first = coord.plan("r1").batch
    assert [r.size for r in first.ranges] == [5, 5]
    write(coord, first.id)
    assert coord.ledger.committed_positions("p") == {("t", 0): 0, ("t", 1): 0}  # PREPARED is not committed
    coord.commit(first.id)
    assert coord.ledger.committed_positions("p") == {("t", 0): 5, ("t", 1): 5}
    second = coord.plan("r2").batch
    assert second.ranges == (OffsetRange("t", 0, 5, 10), OffsetRange("t", 1, 5, 7))
    assert Path(coord.sink.final_dir(first)).exists()


def test_retry_replays_the_same_range_even_with_new_data(coordinator):
    coord, source = coordinator
    planned = coord.plan("r1")
    source.ends[("t", 0)] = 100
    again = coord.plan("r1")
    assert again.action == "replay" and again.batch.ranges == planned.batch.ranges


def test_recovery_first_commits_a_prepared_batch_before_planning(coordinator):
    coord, _ = coordinator
    first = coord.plan("r1").batch
    write(coord, first.id)  # notify_complete never ran
    outcome = coord.plan("r2")
    assert coord.ledger.get_batch(first.id).state is BatchState.COMMITTED
    assert outcome.batch.ranges[0].start == 5


def test_notify_complete_twice_and_after_a_crash_halfway(coordinator):
    coord, _ = coordinator
    batch = coord.plan("r1").batch
    write(coord, batch.id)
    coord.sink.commit(coord.ledger.get_batch(batch.id), coord.ledger.get_batch(batch.id).handles)  # crash here
    assert "already published" in coord.commit(batch.id)
    assert "already committed" in coord.commit(batch.id)
    assert len(list(Path(coord.sink.root).glob("batch_seq=*"))) == 1


def test_lost_output_aborts_the_batch_and_frees_its_range(coordinator):
    coord, _ = coordinator
    batch = coord.plan("r1").batch
    prepared = write(coord, batch.id)
    import shutil

    shutil.rmtree(prepared.handles["staging"])
    with pytest.raises(TransactionLostError, match="processed again"):
        coord.commit(batch.id)
    assert coord.ledger.get_batch(batch.id).state is BatchState.ABORTED
    assert coord.plan("r2").batch.ranges == batch.ranges


def test_abort_releases_the_range_and_a_cleared_run_replays_it_exactly(coordinator):
    coord, source = coordinator
    batch = coord.plan("r1").batch
    coord.sink.prepare(None, coord.begin_write(batch.id), "dead-attempt")
    coord.abort(batch.id, "write failed")
    assert not list((Path(coord.sink.root) / "_staging").iterdir())
    with pytest.raises(SinkError, match="aborted"):
        coord.commit(batch.id)
    source.ends[("t", 0)] = 100
    replay = coord.plan("r1")  # the run is cleared in Airflow: same range, never newer data
    assert replay.action == "replanned" and replay.batch.ranges == batch.ranges


def test_a_later_plan_supersedes_and_fences_an_earlier_writer(coordinator):
    coord, _ = coordinator
    early = coord.plan("a").batch
    claimed = coord.begin_write(early.id)
    late = coord.plan("b").batch
    assert late.ranges == early.ranges
    assert coord.ledger.get_batch(early.id).state is BatchState.ABORTED
    handles = coord.sink.prepare(None, claimed, f"e{claimed.epoch}")
    with pytest.raises(FencedError):
        coord.finish_write(claimed, handles, 0, 0)
    assert not Path(handles["staging"]).exists()  # the fenced writer cleaned up after itself
