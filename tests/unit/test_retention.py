"""Retention's rules on a real ledger (SQLite file): what a prune removes, what it never removes, and that
planning, positions, the tiling check, rewinds and interval re-runs work from the floor it leaves.

The same prune on PostgreSQL, and a prune killed between two of its transactions, are in
tests/integration/test_retention_ledger.py.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from airflow_exactly_once.cli.main import main as cli
from airflow_exactly_once.core import protocol
from airflow_exactly_once.observe.audit import audit_pipeline
from airflow_exactly_once.observe.backlog import read_pipeline
from airflow_exactly_once.core.errors import ConfigurationError, FencedError
from airflow_exactly_once.core.ledger import Ledger, events
from airflow_exactly_once.core.model import Batch, BatchId, OffsetRange
from airflow_exactly_once.core.retention import Retention, prune
from airflow_exactly_once.core.rewind import plan_rewind
from airflow_exactly_once.core.states import BatchState
from tests.harness import FakeSource, MarkerWriter, Pipe, open_ledger, pipeline_config

T0, T1 = ("t", 0), ("t", 1)


@pytest.fixture(autouse=True)
def prune_on_every_commit(monkeypatch):
    """notify_complete prunes once AUTO_PRUNE_MIN batches may go; these small pipelines prune at every one."""
    monkeypatch.setattr(protocol, "AUTO_PRUNE_MIN", 1)


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    ledger = open_ledger(tmp_path / "ledger.db")
    ledger.ensure_pipeline("p", "fp", {"topics": ["t"], "sink": {"type": "parquet", "path": str(tmp_path / "o")}})
    ledger.register_partitions("p", {T0: (0, "startup mode earliest"), T1: (0, "startup mode earliest")})
    return ledger


def record(ledger: Ledger, n: int, state: BatchState = BatchState.COMMITTED, **kwargs) -> Batch:
    """Batch of offsets n*10 .. n*10+10 on both partitions, taken to `state`."""
    epoch = ledger.pipeline("p")["epoch"]
    ranges = [OffsetRange("t", 0, n * 10, n * 10 + 10), OffsetRange("t", 1, n * 10, n * 10 + 10)]
    if state is BatchState.EMPTY:
        return ledger.create_batch("p", f"run-{n}", [], expected_epoch=epoch, state=state, **kwargs)
    batch = ledger.create_batch("p", f"run-{n}", ranges, expected_epoch=epoch, **kwargs)
    if state is BatchState.ABORTED:
        ledger.mark_aborted(batch.id, "failed", release_pending=True)
    if state in (BatchState.PREPARED, BatchState.COMMITTED):
        claimed = ledger.claim(batch.id)
        ledger.mark_prepared(batch.id, claimed.epoch, {}, 20, 20)
    if state is BatchState.COMMITTED:
        ledger.mark_committed(batch.id)
    return ledger.get_batch(batch.id)


def seqs(ledger: Ledger) -> list[int]:
    return [b.seq for b in ledger.list_batches("p", newest_first=False)]


def test_never_pruned_in_flight_pending_or_newest_committed_and_positions_stay_exact(ledger):
    for n in range(10):
        record(ledger, n)  # batches 1..10: t[0], t[1] 0..100
    record(ledger, 10, BatchState.ABORTED)  # 11: its release is pending (recovery needs it)
    record(ledger, 10)  # 12: the newest COMMITTED
    record(ledger, 11, BatchState.EMPTY)  # 13
    record(ledger, 11, BatchState.PREPARED)  # 14: in flight
    ledger.record_event("p", 3, "recovered", "batch 3 was recovered")
    ledger.record_event("p", 12, "recovered", "batch 12 was recovered")
    positions = ledger.committed_positions("p")
    assert positions == {T0: 110, T1: 110}

    report = prune(ledger, "p", Retention(keep_batches=1, keep_days=None), chunk=4)
    assert (report.pruned.through, report.pruned.batches, report.pruned.offset_rows) == (10, 10, 20)
    assert report.pruned.transactions == 3  # 4 + 4 + 2 batches: small transactions
    assert seqs(ledger) == [11, 12, 13, 14]
    floor = ledger.retention_floor("p")
    assert (floor.batch_seq, floor.offsets, floor.pruned_batches) == (10, {T0: 100, T1: 100}, 10)
    assert ledger.committed_positions("p") == positions
    assert [e["batch_seq"] for e in ledger.list_events("p") if e["kind"] == "recovered"] == [12]
    check = audit_pipeline(ledger, "p")
    assert check.ok and "pruned by retention" in check.notes[0] and check.committed_batches == 1
    page = read_pipeline(ledger, "p")  # the ledger page: positions as before, and what retention did
    assert page.committed == positions and page.retention.endswith("; pruned up to batch 10")

    # Nothing more goes while 11 (pending release) and 14 (PREPARED) hold the limit.
    assert prune(ledger, "p", Retention(1, None)).pruned.batches == 0
    ledger.update_details(BatchId("p", 11), release_pending=None)
    ledger.mark_committed(BatchId("p", 14))
    report = prune(ledger, "p", Retention(1, None))
    assert report.pruned.batches == 3 and seqs(ledger) == [14]  # the newest COMMITTED batch stays
    assert ledger.committed_positions("p") == {T0: 120, T1: 120}
    assert audit_pipeline(ledger, "p").ok
    assert ledger.retention_floor("p").pruned_batches == 13


def test_planned_and_prepared_batches_below_newer_commits_stay(ledger):
    """Interval runs are independent: a batch can be in flight below newer COMMITTED ones."""
    for n in range(3):
        record(ledger, n)
    planned = record(ledger, 3, BatchState.PLANNED)  # 4
    record(ledger, 4)  # 5
    prepared = record(ledger, 5, BatchState.PREPARED)  # 6
    record(ledger, 6)  # 7
    assert prune(ledger, "p", Retention(1, None)).pruned.through == 3
    assert seqs(ledger) == [4, 5, 6, 7]
    ledger.mark_aborted(planned.id, "failed")
    assert prune(ledger, "p", Retention(1, None)).pruned.through == 5  # up to the PREPARED batch
    ledger.mark_committed(prepared.id)
    assert prune(ledger, "p", Retention(1, None)).pruned.through == 6 and seqs(ledger) == [7]


def test_a_rewind_whose_output_is_not_withdrawn_yet_holds_the_floor(ledger):
    for n in range(3):
        record(ledger, n)
    # A rewind recorded batches 2 and 3 as RETRACTED; the sink has not withdrawn their output yet.
    ledger.rewind("p", expected_epoch=ledger.pipeline("p")["epoch"], retract=[2, 3],
                  resets={T0: (10, "bug"), T1: (10, "bug")}, reason="bug")
    for n in range(1, 3):
        record(ledger, n)  # 4, 5: the range again
    positions = ledger.committed_positions("p")
    assert prune(ledger, "p", Retention(1, None)).pruned.through == 1  # recovery still needs 2 and 3
    for seq in (2, 3):
        ledger.update_details(BatchId("p", seq), output_retracted=True)
    assert prune(ledger, "p", Retention(1, None)).pruned.through == 4
    assert ledger.committed_positions("p") == positions == {T0: 30, T1: 30}
    assert ledger.position_resets("p") == [] and audit_pipeline(ledger, "p").ok


def test_keep_days_and_keep_batches_both_keep_and_off_keeps_everything(ledger):
    for n in range(6):
        record(ledger, n)
    assert prune(ledger, "p", Retention(None, None)).pruned.batches == 0
    assert prune(ledger, "p", Retention(None, 1)).pruned.batches == 0  # every batch is from today
    later = datetime.now(timezone.utc) + timedelta(days=2)
    dry = prune(ledger, "p", Retention(4, 1), now=later, dry_run=True)
    assert (dry.pruned.batches, dry.pruned.offset_rows) == (2, 4) and seqs(ledger) == [1, 2, 3, 4, 5, 6]
    assert "would remove batches 1..2" in dry.describe()[1]
    assert prune(ledger, "p", Retention(4, 1), now=later).pruned.batches == 2  # the newest 4 stay
    assert prune(ledger, "p", Retention(None, 1), now=later).pruned.batches == 3  # all old but the newest committed
    assert seqs(ledger) == [6]


def test_folded_resets_events_and_bounded_calls(ledger):
    for n in range(3):
        record(ledger, n)
    # Data loss accepted before batch 4: t[0] jumps from 30 to 50 (a reset recorded after batch 3).
    epoch = ledger.pipeline("p")["epoch"]
    batch = ledger.create_batch("p", "run-x", [OffsetRange("t", 0, 50, 60), OffsetRange("t", 1, 30, 40)],
                                expected_epoch=epoch, resets={T0: (50, "log start moved")})
    claimed = ledger.claim(batch.id)
    ledger.mark_prepared(batch.id, claimed.epoch, {}, 1, 1)
    ledger.mark_committed(batch.id)
    for n in range(6, 9):
        record(ledger, n)  # batches 5..7
    before = ledger.committed_positions("p")
    bounded = prune(ledger, "p", Retention(1, None), max_batches=3, chunk=2)
    assert (bounded.pruned.batches, bounded.pruned.transactions, bounded.complete) == (3, 2, False)
    assert ledger.position_resets("p")[0]["after_batch_seq"] == 3  # not folded yet: after batch 3 = the floor
    assert ledger.committed_positions("p") == before
    assert ledger.retention_floor("p").offsets == {T0: 30, T1: 30}
    prune(ledger, "p", Retention(1, None))
    assert ledger.position_resets("p") == [] and ledger.committed_positions("p") == before
    loose = [e for e in ledger.list_events("p", limit=1000) if e["batch_seq"] is None]
    assert loose == []  # "partition-added" and the reset's event predate every kept batch
    with ledger.engine.connect() as conn:
        assert conn.execute(events.select().where(events.c.batch_seq < 7)).first() is None


def test_rewinds_stop_at_the_floor(ledger):
    for n in range(5):
        record(ledger, n)
    prune(ledger, "p", Retention(2, None))
    assert ledger.retention_floor("p").offsets == {T0: 30, T1: 30}
    with pytest.raises(ConfigurationError, match=r"below the retention floor 30.*pruned by retention.*output 'keep'"):
        plan_rewind(ledger, "p", {T0: 25})
    assert [b.seq for b in plan_rewind(ledger, "p", {T0: 30}).retract] == [4, 5]
    keep = plan_rewind(ledger, "p", {T0: 25}, output="keep")  # no output to withdraw: allowed
    assert keep.moves == {T0: (50, 25)}


class TimedSource(FakeSource):
    """Offsets for times: one record per second of record time (offset = seconds)."""

    def offsets_for_times(self, tps, timestamp_ms):
        return {tp: timestamp_ms // 1000 for tp in tps}


def test_interval_reruns_below_the_floor_fail_loudly_and_replacements_keep_their_batch(tmp_path):
    source = TimedSource({T0: 10_000, T1: 10_000})
    config = pipeline_config("iv", ["t"], {"type": "parquet", "path": str(tmp_path / "out")}, range_mode="interval",
                             retention_batches=2, retention_days=None)
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: source, writer_factory=MarkerWriter.of)
    hours = [(h * 100_000, (h + 1) * 100_000) for h in range(6)]

    def run(run_id, interval):
        outcome = pipe.plan(run_id, interval)
        if outcome.needs_commit:
            pipe.write(outcome.batch.id)
            pipe.commit(outcome.batch.id)
        return outcome

    for h in range(5):
        run(f"h{h}", hours[h])
    epoch = pipe.ledger.pipeline("iv")["epoch"]  # what a plan of a re-run read before this prune
    assert pipe.coordinator.retain().startswith("iv: keeps the newest 2 batches")  # what notify_complete calls
    with pytest.raises(FencedError) as fenced:  # it may have meant to replace a pruned batch: it plans again
        pipe.ledger.create_batch("iv", "stale", [], expected_epoch=epoch, interval=hours[5])
    assert fenced.value.retriable
    floor = pipe.ledger.retention_floor("iv")
    assert (floor.batch_seq, floor.interval_end) == (3, hours[2][1])
    with pytest.raises(ConfigurationError, match=r"retention pruned.*retention_batches=2.*new pipeline_id"):
        run("h1-again", hours[1])
    assert run("h3-again", hours[3]).action == "already-committed"  # kept: the no-op still knows
    assert audit_pipeline(pipe.ledger, "iv").ok
    # A replacement in flight keeps the batch it replaces, whatever retention says.
    replace = Pipe(pipeline_config("iv", ["t"], {"type": "parquet", "path": str(tmp_path / "out")},
                                   range_mode="interval", interval_rerun="replace", retention_batches=1,
                                   retention_days=None), pipe.ledger, lambda: source, writer_factory=MarkerWriter.of)
    planned = replace.plan("h3-replace", hours[3]).batch
    assert planned.details["replaces"] == 4
    replace.coordinator.retain()
    assert [b.seq for b in pipe.ledger.list_batches("iv", newest_first=False)] == [4, 5, 6]
    replace.write(planned.id)
    replace.commit(planned.id)
    assert audit_pipeline(pipe.ledger, "iv").ok
    # The mode guard reads the newest batch only (not every batch): switching is still refused.
    continuation = Pipe(pipeline_config("iv", ["t"], {"type": "parquet", "path": str(tmp_path / "out")}),
                        pipe.ledger, lambda: source, writer_factory=MarkerWriter.of)
    with pytest.raises(ConfigurationError, match="has batches planned in interval mode; it cannot switch"):
        continuation.plan("c1")


def test_continuation_plans_from_the_floor(tmp_path):
    source = FakeSource({T0: 1_000, T1: 500})
    config = pipeline_config("c", ["t"], {"type": "parquet", "path": str(tmp_path / "out")},
                             max_records_per_partition=10, retention_batches=3, retention_days=None)
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: source, writer_factory=MarkerWriter.of)
    for i in range(8):
        batch = pipe.plan(f"r{i}").batch
        pipe.write(batch.id)
        pipe.commit(batch.id)
        pipe.coordinator.retain()
    assert [b.seq for b in pipe.ledger.list_batches("c", newest_first=False)] == [6, 7, 8]
    assert pipe.ledger.pipeline("c")["epoch"] == 2 * 8  # each batch: plan and claim; continuation pruning: never
    assert pipe.ledger.committed_positions("c") == {T0: 80, T1: 80}
    following = pipe.plan("r8").batch
    assert following.ranges == (OffsetRange("t", 0, 80, 90), OffsetRange("t", 1, 80, 90))


def test_a_cleared_run_whose_batch_was_pruned_never_takes_newer_data(tmp_path):
    """Invariant 2 across retention: a cleared run with no batch left, due before the newest pruned batch was
    planned, may have had one; it fails naming retention instead of planning the next range."""
    from airflow_exactly_once.core.planning import plan_batch

    source = FakeSource({T0: 1_000})
    config = pipeline_config("c", ["t"], {"type": "parquet", "path": str(tmp_path / "out")},
                             max_records_per_partition=10, retention_batches=2, retention_days=None)
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: source, writer_factory=MarkerWriter.of)
    due = {}
    for i in range(5):
        due[f"r{i}"] = int(datetime.now(timezone.utc).timestamp() * 1000) - 1
        batch = pipe.plan(f"r{i}").batch
        pipe.write(batch.id)
        pipe.commit(batch.id)
        pipe.coordinator.retain()
    floor = pipe.ledger.retention_floor("c")
    assert floor.batch_seq == 3 and floor.batch_created_at is not None  # r0..r2's batches are gone
    with pytest.raises(ConfigurationError, match=r"run r1 was cleared.*retention_batches=2.*Trigger a new run"):
        plan_batch(pipe.coordinator, pipe.source_factory, "r1", cleared_run_after=due["r1"])
    assert pipe.ledger.last_batch_seq("c") == 5  # nothing planned
    # A cleared run whose batch is kept is a recorded no-op as before; a cleared run due after the pruned
    # batches (it failed before planning) and a run never cleared plan the next range.
    kept = plan_batch(pipe.coordinator, pipe.source_factory, "r4", cleared_run_after=due["r4"])
    assert kept.action == "already-committed" and kept.batch.seq == 5
    late = plan_batch(pipe.coordinator, pipe.source_factory, "late", cleared_run_after=due["r4"])
    assert (late.action, late.batch.ranges) == ("planned", (OffsetRange("t", 0, 50, 60),))


def test_notify_complete_prunes_only_once_enough_may_go(tmp_path, monkeypatch):
    monkeypatch.setattr(protocol, "AUTO_PRUNE_MIN", 4)
    source = FakeSource({T0: 1_000})
    config = pipeline_config("c", ["t"], {"type": "parquet", "path": str(tmp_path / "out")},
                             max_records_per_partition=10, retention_batches=2, retention_days=None)
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: source, writer_factory=MarkerWriter.of)
    floors, reads = [], []
    sent: list[str] = []
    sa.event.listen(pipe.ledger.engine, "before_cursor_execute", lambda *args: sent.append(args[2]))
    for i in range(9):
        batch = pipe.plan(f"r{i}").batch
        pipe.write(batch.id)
        pipe.commit(batch.id)
        sent.clear()
        pipe.coordinator.retain()
        reads.append(len([s for s in sent if "aeo_" in s]))
        floors.append(pipe.ledger.retention_floor("c").batch_seq)
    assert floors == [0, 0, 0, 0, 0, 4, 4, 4, 4]  # batches 1..4 go together, after the 6th commit
    # Until 4 batches may go, retain reads the floor (and its offsets, once there is one) and the newest batch
    # number only (Ledger.prune_bounds), not the queries of the limit.
    assert reads[:5] == [2] * 5 and reads[6:] == [3] * 3 and reads[5] > 10, reads


def test_prune_cli_dry_run_then_execute(ledger, capsys):
    for n in range(5):
        record(ledger, n)
    url = str(ledger.engine.url)
    assert cli(["--ledger-url", url, "prune", "p", "--keep-batches", "2", "--keep-days", "none"]) == 0
    out = capsys.readouterr().out
    assert "would remove batches 1..3: 3 batches, 6 offset rows" in out and "add --execute" in out
    assert seqs(ledger) == [1, 2, 3, 4, 5]
    assert cli(["--ledger-url", url, "--json", "prune", "p", "--keep-batches", "2", "--keep-days", "none",
                "--execute"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert (done["batches"], done["offset_rows"], done["through"], done["executed"]) == (3, 6, 3, True)
    assert seqs(ledger) == [4, 5]
    assert cli(["--ledger-url", url, "check", "p", "--without", "asset-events"]) == 0
    assert "pruned by retention" in capsys.readouterr().out
    assert cli(["--ledger-url", url, "show", "p:2"]) == 2
    assert "batch p:2 was pruned by retention (batches up to 3 are gone" in capsys.readouterr().err
    assert cli(["--ledger-url", url, "prune", "p"]) == 0  # the stored config has no retention: the defaults
    assert "keeps the newest 1000 batches and the last 7 days; nothing to prune" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli(["--ledger-url", url, "prune", "p", "--keep-batches", "0"])
    assert "give a number of batches (1 or more), or none" in capsys.readouterr().err


@pytest.mark.parametrize("name, value", [("retention_batches", 0), ("retention_batches", 2.5),
                                         ("retention_days", -1), ("retention_days", "soon")])
def test_bad_retention_settings_name_the_fix(tmp_path, name, value):
    with pytest.raises(ConfigurationError, match=rf"{name}=.*give a number above 0.*None"):
        pipeline_config("p", ["t"], {"type": "parquet", "path": str(tmp_path)}, **{name: value})
