"""Pure logic of issue 5 on real ledgers (SQLite and PostgreSQL): positions with resets, empty
and retracted batches, interval boundaries, rewinds, the tiling audit, configuration errors
and the CLI.

No Kafka, no Spark: these are the decisions, tested one by one; the end-to-end tests in
test_operations_airflow.py run them with the real components.
"""

from __future__ import annotations

import json

import pytest

from airflow_exactly_once.cli.main import main as cli
from airflow_exactly_once.observe.audit import audit_pipeline
from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError, DataLossError, FencedError, IllegalTransitionError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import Batch, OffsetRange
from airflow_exactly_once.core.ranges import interval_ranges
from airflow_exactly_once.core.rewind import apply_rewind, finish_retractions, plan_rewind
from airflow_exactly_once.core.states import BatchState, check_transition
from airflow_exactly_once.core.timestamps import to_epoch_ms
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks.parquet.sink_committer import ParquetSinkCommitter
from tests.harness import FakeSource, Pipe

TP = ("t", 0)


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request, tmp_path, unique) -> Ledger:
    """A fresh ledger on each backend (a throwaway database on the session's real PostgreSQL)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        url = request.getfixturevalue("postgres").create_database(f"ops_{unique}")
    ledger = Ledger(url)
    ledger.ensure_pipeline("p", "fp", {"topics": ["t"], "sink": {"type": "parquet", "path": str(tmp_path / "out")}})
    ledger.register_partitions("p", {TP: (0, "startup mode earliest"), ("t", 1): (0, "startup mode earliest")})
    yield ledger
    ledger.engine.dispose()


def commit(ledger: Ledger, ranges: list[OffsetRange], run: str = "r", **kwargs) -> Batch:
    epoch = ledger.pipeline("p")["epoch"]
    batch = ledger.create_batch("p", run, ranges, expected_epoch=epoch, **kwargs)
    claimed = ledger.claim(batch.id)
    ledger.mark_prepared(batch.id, claimed.epoch, {}, sum(r.size for r in ranges), sum(r.size for r in ranges))
    ledger.mark_committed(batch.id)
    return ledger.get_batch(batch.id)


def two(start0: int, end0: int, start1: int, end1: int) -> list[OffsetRange]:
    return [OffsetRange("t", 0, start0, end0), OffsetRange("t", 1, start1, end1)]


def test_new_states_have_one_transition_table():
    check_transition(BatchState.COMMITTED, BatchState.RETRACTED)
    for state in (BatchState.EMPTY, BatchState.RETRACTED, BatchState.ABORTED):
        assert state.terminal
        with pytest.raises(IllegalTransitionError):
            check_transition(state, BatchState.COMMITTED)
    with pytest.raises(IllegalTransitionError):
        check_transition(BatchState.PREPARED, BatchState.RETRACTED)  # only committed output can be withdrawn


def test_position_follows_the_newest_batch_and_recorded_resets(ledger):
    commit(ledger, two(0, 100, 0, 50))
    assert ledger.committed_positions("p") == {TP: 100, ("t", 1): 50}
    # The topic was recreated: data loss accepted by "skip" resets t[0] to 0 with the next batch.
    epoch = ledger.pipeline("p")["epoch"]
    planned = ledger.create_batch("p", "r2", two(0, 10, 50, 60), expected_epoch=epoch,
                                  resets={TP: (0, "recreated")})
    assert ledger.committed_positions("p") == {TP: 0, ("t", 1): 50}  # the reset counts before the batch commits
    ledger.mark_prepared(planned.id, ledger.claim(planned.id).epoch, {}, 20, 20)
    ledger.mark_committed(planned.id)
    # Max end would say 100 and re-read the recreated topic from 0 again; the newest batch says 10.
    assert ledger.committed_positions("p") == {TP: 10, ("t", 1): 60}
    report = audit_pipeline(ledger, "p")
    assert report.ok, report.problems
    assert report.notes == ["data-loss-skip after batch 1: t[0] 100 -> 0 (recreated)"]


def test_empty_batches_are_recorded_and_move_nothing(ledger):
    commit(ledger, two(0, 10, 0, 10))
    epoch = ledger.pipeline("p")["epoch"]
    empty = ledger.create_batch("p", "r2", two(10, 10, 10, 10), expected_epoch=epoch, state=BatchState.EMPTY)
    assert empty.state is BatchState.EMPTY and empty.is_empty
    assert ledger.committed_positions("p") == {TP: 10, ("t", 1): 10}
    with pytest.raises(IllegalTransitionError):
        ledger.create_batch("p", "r3", [], expected_epoch=ledger.pipeline("p")["epoch"], state=BatchState.COMMITTED)


def test_audit_finds_gaps_and_overlaps(ledger):
    commit(ledger, two(0, 10, 0, 10))
    commit(ledger, two(12, 20, 5, 20))  # written by hand: a gap in t[0], an overlap in t[1]
    problems = audit_pipeline(ledger, "p").problems
    assert problems == ["batch 2: t[0] starts at 12, expected 10 (gap of 2 offsets)",
                        "batch 2: t[1] starts at 5, expected 10 (overlap of 5 offsets)"]


def test_rewind_retract_rounds_to_batch_boundaries_and_withdraws_output(ledger, tmp_path):
    batches = [commit(ledger, two(0, 10, 0, 10)), commit(ledger, two(10, 20, 10, 20)),
               commit(ledger, two(20, 30, 20, 25))]
    sink = ParquetSinkCommitter({"type": "parquet", "path": str(tmp_path / "out")})
    for batch in batches:
        sink.layout.final_dir(batch).mkdir(parents=True)
        sink.layout.manifest_entry(batch).parent.mkdir(parents=True, exist_ok=True)
        sink.layout.manifest_entry(batch).write_text("{}")
    plan = plan_rewind(ledger, "p", {TP: 15})
    assert [b.seq for b in plan.retract] == [2, 3]  # batch 2 holds t[0] 10..19, so it goes as a whole
    assert plan.moves == {TP: (30, 10), ("t", 1): (25, 10)}
    apply_rewind(ledger, sink, plan, "bug fix")
    assert [b.state for b in ledger.list_batches("p", newest_first=False)] == [
        BatchState.COMMITTED, BatchState.RETRACTED, BatchState.RETRACTED]
    assert ledger.committed_positions("p") == {TP: 10, ("t", 1): 10}
    assert sorted(p.name for p in (tmp_path / "out").glob("batch_seq=*")) == ["batch_seq=1"]
    assert sorted(p.name for p in (tmp_path / "out" / "_manifest").iterdir()) == ["batch-000000001.json"]
    assert ledger.open_work("p").retractions == []
    # Reprocessing continues from the reset. Retracted batches no longer count, so the committed
    # ranges tile without any discontinuity; the rewind is on record.
    commit(ledger, two(10, 30, 10, 25))
    report = audit_pipeline(ledger, "p")
    assert report.ok, report.problems
    assert any(note.startswith("rewind after batch 3: t[0] 10 -> 10") for note in report.notes)


def test_an_interrupted_rewind_is_finished_by_recovery(ledger, tmp_path):
    batch = commit(ledger, two(0, 10, 0, 10))
    sink = ParquetSinkCommitter({"type": "parquet", "path": str(tmp_path / "out")})
    sink.layout.final_dir(batch).mkdir(parents=True)
    plan = plan_rewind(ledger, "p", {TP: 0})
    # The ledger step of apply_rewind, and then the process dies before the sink step.
    ledger.rewind("p", expected_epoch=plan.epoch, retract=[1], resets={TP: (0, "x")}, reason="crash")
    assert [b.seq for b in ledger.open_work("p").retractions] == [1]
    assert not audit_pipeline(ledger, "p").ok  # the audit tells
    assert finish_retractions(ledger, sink, "p") == ["batch 1: withdrew batch_seq=1"]
    assert not sink.layout.final_dir(batch).exists()
    assert finish_retractions(ledger, sink, "p") == []


def test_rewind_keep_records_the_overlap(ledger):
    commit(ledger, two(0, 10, 0, 10))
    plan = plan_rewind(ledger, "p", {TP: 4}, output="keep")
    assert plan.retract == [] and plan.moves == {TP: (10, 4)}
    apply_rewind(ledger, ParquetSinkCommitter({"type": "parquet", "path": "/nonexistent"}), plan, "redeliver")
    commit(ledger, two(4, 10, 10, 10))
    report = audit_pipeline(ledger, "p")
    assert report.ok and "rewind after batch 1: t[0] 10 -> 4" in report.notes[0]


def test_rewind_safety_checks(ledger):
    commit(ledger, two(0, 10, 0, 10))
    with pytest.raises(ConfigurationError, match="past the committed position 10"):
        plan_rewind(ledger, "p", {TP: 11})
    with pytest.raises(ConfigurationError, match=r"no longer in the topic \(log start is 5\)"):
        plan_rewind(ledger, "p", {TP: 2}, log_starts={TP: 5})
    with pytest.raises(ConfigurationError, match=r"t\[7\] is not a partition"):
        plan_rewind(ledger, "p", {("t", 7): 0})
    with pytest.raises(ConfigurationError, match="no pipeline 'nope'"):
        plan_rewind(ledger, "nope", {TP: 0})
    stale = plan_rewind(ledger, "p", {TP: 0})
    in_flight = ledger.create_batch("p", "r2", two(10, 12, 10, 12), expected_epoch=ledger.pipeline("p")["epoch"])
    with pytest.raises(FencedError, match="is PLANNED: a rewind must not move offsets"):
        plan_rewind(ledger, "p", {TP: 0})
    with pytest.raises(FencedError):  # a plan made before the batch appeared is refused by the ledger too
        apply_rewind(ledger, ParquetSinkCommitter({"type": "parquet", "path": "/nonexistent"}), stale, "late")
    assert ledger.get_batch(in_flight.id).state is BatchState.PLANNED
    assert ledger.committed_positions("p") == {TP: 10, ("t", 1): 10}


def test_boundaries_are_fixed_once_and_never_cross(ledger):
    first = ledger.fix_boundaries("p", {(TP, 1000): (5, "a"), (TP, 3000): (9, "b")})
    assert first == {(TP, 1000): 5, (TP, 3000): 9}
    # Kafka now answers differently (late records): recorded boundaries win, new ones stay between.
    again = ledger.fix_boundaries("p", {(TP, 1000): (7, "c"), (TP, 2000): (12, "d"), (TP, 500): (6, "e")})
    assert again == {(TP, 1000): 5, (TP, 2000): 9, (TP, 500): 5}


def test_interval_ranges_apply_the_data_loss_policy():
    config = PipelineConfig(pipeline_id="p", topics=["t"], sink={"type": "parquet", "path": "/x"},
                                    bootstrap_servers="k:1", range_mode="interval")
    fixed = {(TP, 0): 10, (TP, 100): 20}
    ranges, skipped = interval_ranges(config, [TP], fixed, (0, 100), {TP: 0}, {TP: 30})
    assert ranges == [OffsetRange("t", 0, 10, 20)] and skipped == []
    with pytest.raises(DataLossError, match=r"offsets 10..14 of t\[0\] in this interval are no longer"):
        interval_ranges(config, [TP], fixed, (0, 100), {TP: 15}, {TP: 30})
    config.data_loss_policy = "skip"
    ranges, skipped = interval_ranges(config, [TP], fixed, (0, 100), {TP: 15}, {TP: 30})
    assert ranges == [OffsetRange("t", 0, 15, 20)] and len(skipped) == 1
    ranges, _ = interval_ranges(config, [TP], fixed, (0, 100), {TP: 0}, {TP: 3})  # recreated, 3 records
    assert ranges == [OffsetRange("t", 0, 3, 3)]


@pytest.mark.parametrize("overrides, message", [
    ({"startup_mode": "timestamp"}, "startup_timestamp (startup_mode='timestamp') is missing"),
    ({"startup_mode": "timestamp", "startup_timestamp": "yesterday"}, "'yesterday' is not a time"),
    ({"startup_mode": "specific_offsets"}, "needs startup_offsets"),
    ({"startup_mode": "specific_offsets", "startup_offsets": {"other:0": 1}}, "must name a partition of ['t']"),
    ({"startup_mode": "specific_offsets", "startup_offsets": {"t": {"0": -4}}}, "is not an offset"),
    ({"startup_mode": "group_offsets"}, "needs startup_group_id"),
    ({"startup_mode": "from-the-start"}, "choose one of earliest, latest, timestamp, specific_offsets"),
    ({"startup_offsets": {"t:0": 1}}, "only used with startup_mode='specific_offsets'"),
    ({"range_mode": "interval", "max_records_per_partition": 5}, "does not apply to range_mode='interval'"),
    ({"range_mode": "interval", "startup_mode": "latest"}, "does not apply to range_mode='interval'"),
    ({"interval_rerun": "twice"}, "choose one of noop, replace"),
])
def test_bad_configuration_names_the_problem(overrides, message):
    with pytest.raises(ConfigurationError) as info:
        checked(PipelineConfig(pipeline_id="p", topics=["t"], sink={"type": "parquet", "path": "/x"},
                                    bootstrap_servers="k:1", **overrides))
    assert message in str(info.value)


def test_startup_arguments_are_normalised():
    config = checked(PipelineConfig(pipeline_id="p", topics=["t"], sink={"type": "parquet", "path": "/x"},
                                    bootstrap_servers="k:1",
                                    startup_mode="specific_offsets", startup_offsets={"t": {0: 5, "1": 7}}))
    assert config.startup_offsets == {"t:0": 5, "t:1": 7}
    assert config.startup_offset_map() == {("t", 0): 5, ("t", 1): 7}
    stamped = checked(PipelineConfig(pipeline_id="p", topics=["t"], sink={"type": "parquet", "path": "/x"},
                                    bootstrap_servers="k:1", startup_mode="timestamp",
                             startup_timestamp="2024-05-01T00:00:00Z"))
    assert stamped.startup_timestamp == to_epoch_ms("2024-05-01T00:00:00+00:00") == 1714521600000


def test_cli_lists_shows_and_checks(ledger, tmp_path, capsys):
    url = str(ledger.engine.url)
    commit(ledger, two(0, 10, 0, 5), run="run-1")
    ledger.create_batch("p", "run-2", two(10, 10, 5, 5), expected_epoch=ledger.pipeline("p")["epoch"],
                        state=BatchState.EMPTY)
    assert cli(["--ledger-url", url, "pipelines"]) == 0
    out = capsys.readouterr().out
    assert "p " in out and "COMMITTED=1 EMPTY=1" in out
    assert cli(["--ledger-url", url, "--json", "batches", "p"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["seq"], r["state"], r["run_id"], r["offsets"]) for r in rows] == [
        (2, "EMPTY", "run-2", 0), (1, "COMMITTED", "run-1", 15)]
    assert cli(["--ledger-url", url, "show", "p:1"]) == 0
    out = capsys.readouterr().out
    assert "batch p:1  COMMITTED" in out and "t[0]  0..10  (10 offsets)" in out and "15 read, 15 written" in out
    assert cli(["--ledger-url", url, "check", "p", "--without", "asset-events"]) == 0
    assert "tiling OK" in capsys.readouterr().out
    assert cli(["--ledger-url", url, "show", "q:1"]) == 2
    assert "no pipeline 'q' in this ledger (known: p)" in capsys.readouterr().err


def test_clearing_an_aborted_run_after_a_rewind_replays_nothing(ledger, tmp_path):
    sink = ParquetSinkCommitter({"type": "parquet", "path": str(tmp_path / "out")})
    config = checked(PipelineConfig(pipeline_id="p", topics=["t"], sink=sink.spec, bootstrap_servers="k:1"))
    commit(ledger, two(0, 10, 0, 10))
    aborted = ledger.create_batch("p", "run-2", two(10, 20, 10, 20), expected_epoch=ledger.pipeline("p")["epoch"])
    ledger.mark_aborted(aborted.id, "write failed for good")
    apply_rewind(ledger, sink, plan_rewind(ledger, "p", {TP: 5}, output="keep"), "reprocess")
    # Replaying run-2's old range now would skip t[0] 5..9; the cleared run writes nothing instead.
    outcome = Pipe(config, ledger, lambda: FakeSource({TP: 20, ("t", 1): 20}), committer_factory=lambda c: ParquetSinkCommitter(c.sink)).plan("run-2")
    assert outcome.action == "superseded" and "has moved from 10 to 5" in outcome.message
    assert ledger.committed_positions("p") == {TP: 5, ("t", 1): 10}
