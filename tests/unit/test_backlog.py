"""What the ledger page and the backlog trigger compute from the ledger and Kafka's offsets.

A real ledger (SQLite file) filled through the protocol (tests/harness.py, a fake source and a
file sink that needs no Spark); Kafka's answers are given as numbers. The same code against
the real broker and Airflow: tests/integration/test_backlog_trigger.py, tests/system/test_ui_page.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from airflow_exactly_once.observe.backlog import (
    PartitionLag,
    WakeGate,
    WakeRule,
    claimed_positions,
    partition_lags,
    read_pipeline,
    waited_too_long,
    waiting_records,
)
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.ledger import Ledger, missing_sqlite_file
from airflow_exactly_once.core.model import Batch, OffsetRange
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.ui.access import pipeline_dag_ids, reads_every_dag, visible_pipelines
from tests.harness import FakeSource, MarkerWriter, Pipe, open_ledger, pipeline_config

A, B = ("t", 0), ("t", 1)


@pytest.fixture
def pipe(tmp_path) -> Pipe:
    source = FakeSource({A: 10, B: 7})
    config = pipeline_config("p", ["t"], {"type": "parquet", "path": str(tmp_path / "out")},
                             max_records_per_partition=5)
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: source, writer_factory=MarkerWriter.of)
    pipe.fake_source = source
    return pipe


# -- positions, waiting records, lag -------------------------------------------------------


def test_a_batch_in_flight_moves_the_position_the_next_batch_would_start_at():
    committed = {A: 5, B: 5}
    flying = [Batch("p", 2, "r2", BatchState.PLANNED, 3, (OffsetRange("t", 0, 5, 9), OffsetRange("t", 1, 5, 5)))]
    assert claimed_positions(committed, flying) == {A: 9, B: 5}


def test_waiting_records_count_from_the_position_or_the_log_start():
    positions = {A: 5}
    last_stable, log_start = {A: 12, B: 4}, {A: 0, B: 1}
    # B is unknown to the ledger: counted from its log start, as a new pipeline reading "earliest" would
    assert waiting_records(positions, last_stable, log_start) == {A: 7, B: 3}
    # a position below the log start (records deleted): only what is still there waits
    assert waiting_records({A: 2}, {A: 12}, {A: 10}) == {A: 2}
    assert waiting_records({A: 12}, {A: 12}, {A: 0}) == {A: 0}


def test_the_oldest_waiting_record_is_too_old_when_the_cutoff_falls_after_it():
    positions, last_stable, log_start = {A: 5, B: 3}, {A: 9, B: 3}, {A: 0, B: 0}
    # A: the first record at/after the cutoff is offset 7 > 5, so offset 5 is older than the cutoff
    assert waited_too_long(positions, last_stable, log_start, {A: 7}) == [A]
    # None: no record at/after the cutoff below the last stable offset, so every waiting record is older
    assert waited_too_long(positions, last_stable, log_start, {A: None}) == [A]
    # the record at the position itself is newer than the cutoff
    assert waited_too_long(positions, last_stable, log_start, {A: 5}) == []
    # nothing waits on B, whatever Kafka says
    assert waited_too_long(positions, last_stable, log_start, {B: None}) == []


def test_lag_rows_compare_the_committed_position_with_the_last_stable_offset():
    rows = partition_lags({A: 5, B: 7}, {A: 9, B: 7}, {A: 20, B: 7}, {A: 0, B: 8})
    assert rows == [PartitionLag("t", 0, 5, 9, 20, 0), PartitionLag("t", 1, 7, None, 7, 8)]
    assert [r.lag for r in rows] == [15, 0]
    assert rows[1].below_log_start and not rows[0].below_log_start
    unknown = partition_lags({A: 5}, {A: 5}, {}, {})
    assert unknown[0].lag is None  # Kafka was not asked (or did not answer)


# -- when the trigger fires ------------------------------------------------------------------


def test_wake_rule_fires_on_enough_records_or_on_an_old_one():
    rule = WakeRule(min_records=100, max_wait_ms=60_000).validate()
    assert rule.reason(100, aged=False) == "min_records"
    assert rule.reason(99, aged=False) is None
    assert rule.reason(3, aged=True) == "max_wait"
    assert rule.reason(0, aged=True) is None
    assert WakeRule(min_records=5).reason(4, aged=True) is None  # no max_wait: only the count counts


@pytest.mark.parametrize("kwargs, message", [
    ({"min_records": 0}, "min_records=0 must be a whole number >= 1"),
    ({"min_records": True}, "min_records=True"),
    ({"min_records": 1, "max_wait_ms": 0}, "max_wait=0 ms must be positive"),
])
def test_wake_rule_refuses_settings_that_make_no_sense(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        WakeRule(**kwargs).validate()


def test_the_gate_lets_one_event_through_per_planned_batch():
    gate = WakeGate(rearm_s=600)
    assert gate.open(last_seq=4, now_s=0)
    gate.fired(last_seq=4, now_s=0)
    assert not gate.open(last_seq=4, now_s=10)  # the run it asked for has not planned yet
    assert not gate.open(last_seq=4, now_s=599)
    assert gate.open(last_seq=5, now_s=30)  # it planned: its range now counts as in flight
    gate.fired(last_seq=5, now_s=30)
    assert gate.open(last_seq=5, now_s=630)  # no run came for 600 s: ask again


# -- the page's view of a real ledger ----------------------------------------------------------


def test_read_pipeline_shows_batches_in_flight_events_and_the_chart(pipe):
    first = pipe.plan("r1").batch
    pipe.write(first.id)
    pipe.commit(first.id)
    second = pipe.plan("r2").batch
    pipe.write(second.id)  # PREPARED, never committed: the next plan recovers it
    pipe.fake_source.ends[A] = 14
    third = pipe.plan("r3").batch  # recovery commits batch 2 first, then plans batch 3 (PLANNED, in flight)
    ledger = pipe.ledger
    ledger.record_dag("p", "dag_p")

    now = datetime.now(timezone.utc) + timedelta(seconds=30)
    report = read_pipeline(ledger, "p", now=now, commit_deadline_ms=60_000)
    assert [(b.seq, b.state) for b in report.batches] == [
        (3, BatchState.PLANNED), (2, BatchState.COMMITTED), (1, BatchState.COMMITTED)]
    assert report.counts == {"COMMITTED": 2, "PLANNED": 1} and report.last_seq == 3
    assert report.committed == {A: 10, B: 7}
    assert third.ranges == (OffsetRange("t", 0, 10, 14), OffsetRange("t", 1, 7, 7))
    assert report.claimed == {A: 14, B: 7}
    [flying] = report.in_flight
    assert flying.seq == 3 and flying.deadline_s == 60 and 29 < flying.age_s < 90 and not flying.overdue
    assert [p.seq for p in report.chart] == [1, 2] and [p.records for p in report.chart] == [10, 7]
    assert all(p.duration_s is not None and p.duration_s >= 0 for p in report.chart)
    recovered = [e for e in report.events if e["kind"] == "recovered"]
    assert recovered and recovered[0]["batch_seq"] == 2 and "run r2" in recovered[0]["message"]
    assert read_pipeline(ledger, "nope") is None


def test_overdue_when_older_than_the_sinks_deadline(pipe):
    batch = pipe.plan("r1").batch
    later = datetime.now(timezone.utc) + timedelta(minutes=5)
    [flying] = read_pipeline(pipe.ledger, "p", now=later, commit_deadline_ms=60_000).in_flight
    assert flying.seq == batch.seq and flying.overdue and flying.remaining_s < 0


# -- the ledger, read only ------------------------------------------------------------------


def test_a_read_only_ledger_reads_but_never_writes_nor_creates(tmp_path, pipe):
    pipe.plan("r1")
    url = str(pipe.ledger.engine.url)
    reader = Ledger.read_only(url)
    assert reader.has_schema() and reader.last_batch_seq("p") == 1
    with pytest.raises(sa.exc.OperationalError, match="readonly"):
        reader.record_event("p", None, "x", "must not be written")
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    assert missing_sqlite_file(missing) and not missing_sqlite_file(url)
    with pytest.raises(sa.exc.OperationalError):
        Ledger.read_only(missing).has_schema()
    assert not (tmp_path / "none.db").exists()


def test_dags_of_a_pipeline_are_recorded_once(pipe):
    pipe.plan("r1")
    for dag in ("dag_a", "dag_a", "dag_b"):
        pipe.ledger.record_dag("p", dag)
    assert pipe.ledger.pipeline_dags() == {"p": {"dag_a", "dag_b"}}
    assert pipe.ledger.run_ids("p") == {"r1"}


# -- who sees what --------------------------------------------------------------------------


def test_a_pipeline_is_visible_only_with_read_access_to_all_of_its_dags():
    dags_of = pipeline_dag_ids(["a", "b", "c", "orphan"], {"a": {"dag_a"}, "b": {"dag_a", "dag_b"}},
                               lambda p: {"dag_c"} if p == "c" else set())
    assert dags_of == {"a": {"dag_a"}, "b": {"dag_a", "dag_b"}, "c": {"dag_c"}, "orphan": set()}
    assert visible_pipelines(dags_of, {"dag_a"}, reads_all_dags=False) == ["a"]
    assert visible_pipelines(dags_of, {"dag_a", "dag_b", "dag_c"}, reads_all_dags=False) == ["a", "b", "c"]
    # a pipeline tied to no DAG: only for users who may read every DAG
    assert visible_pipelines(dags_of, {"dag_a", "dag_b", "dag_c"}, reads_all_dags=True) == ["a", "b", "c", "orphan"]
    assert visible_pipelines(dags_of, set(), reads_all_dags=False) == []


def test_reading_all_dags_means_reading_each_dag_airflow_knows_not_just_listing_dags():
    known = {"dag_a", "dag_b"}
    assert reads_every_dag(True, known, {"dag_a", "dag_b"})
    # FAB lets a user who may read one DAG list DAGs: that is not "all DAGs"
    assert not reads_every_dag(True, known, {"dag_a"})
    assert not reads_every_dag(False, known, {"dag_a", "dag_b"})
