"""Event-driven runs end to end: Airflow's triggerer runs the backlog trigger of an Asset watcher.

dags/kafka_to_parquet_on_arrival.py is scheduled on the Asset; the session's stack has a real
triggerer (tests/conftest.py: min_records 20, a poll every 2 s, max_wait an hour). Nobody
triggers a run here: records are produced and the runs start by themselves.
"""

from __future__ import annotations

import os
import re
import signal
from datetime import datetime, timezone

from airflow_exactly_once.observe.backlog import utc
from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.states import BatchState
from tests.conftest import ARRIVAL_MIN_RECORDS, ARRIVAL_POLL_SECONDS, ARRIVAL_TOPIC
from tests.harness import airflow_ledger
from tests.helpers import assert_exactly_once, assert_ranges_tile, produce, read_parquet, wait_for

DAG_ID = PIPELINE = "kafka_to_parquet_on_arrival"
BELOW = ARRIVAL_MIN_RECORDS // 4  # records that must not start a run


def wait_until(what: str, check, timeout: float, stack=None, every: float = 1.0):
    """tests.helpers.wait_for, in this module's argument order, checking the stack's components are alive."""
    return wait_for(check, what, timeout, poll=every, stack=stack)


def parse(moment: str) -> datetime:
    return datetime.fromisoformat(moment.replace("Z", "+00:00"))


def finished(runs: list[dict]) -> bool:
    return all(r["state"] in ("success", "failed") for r in runs)


def ids_in(output) -> list[str]:
    return [str(row["id"]) for row in read_parquet(output)]


def backlog_lines(airflow) -> int:
    """The trigger logs what waits whenever it changes: a new line is a poll that saw the change."""
    return airflow.log_text("triggerer").count(f"pipeline {PIPELINE}: ") - firings(airflow)


def firings(airflow) -> int:
    return airflow.log_text("triggerer").count(f"pipeline {PIPELINE}: firing")


def fired_log(faults) -> str:
    path = faults / "fired.log"
    return path.read_text() if path.exists() else ""


def committed_at(ledger, run_id: str) -> datetime:
    batch = ledger.latest_batch_for_run(PIPELINE, run_id)
    assert batch is not None and batch.state is BatchState.COMMITTED, batch
    return utc(batch.updated_at)


def test_records_start_runs_by_themselves_once_per_batch_never_a_pile_up(kafka, airflow, arrival_output, warm_spark,
                                                                          faults):
    # warm_spark: the example's write runs on the session's Spark Connect server (its environment says so)
    airflow.wait_for_dag(DAG_ID)
    # The triggerer picked the watcher up and looked at the (empty) topic.
    wait_until("the backlog trigger reports the idle topic",
               lambda: f"pipeline {PIPELINE}: 0 records wait" in airflow.log_text("triggerer"), 180, airflow)
    # Fewer records than min_records: a poll sees them (its log line is the proof) and starts nothing.
    produce(kafka.bootstrap_servers, ARRIVAL_TOPIC, BELOW, json_values=True)
    wait_until("a poll that sees the records below min_records",
               lambda: f"pipeline {PIPELINE}: {BELOW} records wait" in airflow.log_text("triggerer"), 60, airflow,
               every=0.2)
    assert firings(airflow) == 0 and airflow.runs(DAG_ID) == [], "a run started below min_records"

    # Enough records: one run starts by itself and commits them, exactly once.
    produce(kafka.bootstrap_servers, ARRIVAL_TOPIC, 30 - BELOW, start=BELOW, json_values=True)
    produced_at = datetime.now(timezone.utc)
    [first] = wait_until("a run started by the records", lambda: airflow.runs(DAG_ID), 120, airflow)
    assert first["run_type"] == "asset_triggered", first
    assert airflow.wait_run(DAG_ID, first["dag_run_id"]) == "success"
    ledger = airflow_ledger(airflow)
    latency = (committed_at(ledger, first["dag_run_id"]) - produced_at).total_seconds()
    assert_exactly_once([str(i) for i in range(30)], ids_in(arrival_output))

    # More records, and more again while that run's batch is in flight: one more run, not one per burst.
    # The second run's write holds at a fault point once its batch is PREPARED (SIGSTOP, until the test's SIGCONT):
    # a warm write takes about 2 s, shorter than a loaded machine's answer to the test's polls.
    arm(faults, "write.after_prepare", "pause")
    produce(kafka.bootstrap_servers, ARRIVAL_TOPIC, 30, start=30, json_values=True)
    held = wait_until("the second run's write held at write.after_prepare",
                      lambda: re.search(r"write\.after_prepare pause pid=(\d+)", fired_log(faults)), 180, airflow,
                      every=0.2)
    [_, second] = airflow.runs(DAG_ID)
    try:
        assert ledger.latest_batch_for_run(PIPELINE, second["dag_run_id"]).state is BatchState.PREPARED
        for burst in range(3):
            polls_seen = backlog_lines(airflow)
            produce(kafka.bootstrap_servers, ARRIVAL_TOPIC, 25, start=60 + 25 * burst, json_values=True)
            # The trigger looks in between: the burst changes what waits, so a poll that saw it logs a line.
            wait_until("a poll after the burst", lambda: backlog_lines(airflow) > polls_seen, 60, airflow, every=0.2)
    finally:
        os.kill(int(held.group(1)), signal.SIGCONT)
    assert airflow.wait_run(DAG_ID, second["dag_run_id"]) == "success"
    runs = wait_until("the run for the bursts", lambda: airflow.runs(DAG_ID)[2:] and airflow.runs(DAG_ID), 120,
                      airflow)
    wait_until("every run finished", lambda: finished(airflow.runs(DAG_ID)), 600, airflow, every=2)
    runs = airflow.runs(DAG_ID)
    assert [r["state"] for r in runs] == ["success"] * 3, [(r["dag_run_id"], r["state"]) for r in runs]
    # No pile-up, and none to come: every firing made one of these runs, and no Asset event waits for a run.
    assert firings(airflow) == 3, airflow.log_text("triggerer")
    assert airflow.api("GET", f"/dags/{DAG_ID}/assets/queuedEvents")["queued_events"] == []
    assert all(r["run_type"] == "asset_triggered" for r in runs)
    # max_active_runs=1: one after the other
    for before, after in zip(runs, runs[1:]):
        assert before["end_date"] <= after["start_date"], (before, after)

    assert_exactly_once([str(i) for i in range(135)], ids_in(arrival_output))
    batches = ledger.list_batches(PIPELINE, newest_first=False)
    assert [(b.state, b.output_records) for b in batches] == [(BatchState.COMMITTED, 30), (BatchState.COMMITTED, 30),
                                                             (BatchState.COMMITTED, 75)]
    assert_ranges_tile(ledger, PIPELINE)
    assert ledger.pipeline_dags()[PIPELINE] == {DAG_ID}  # plan recorded the DAG (the ledger page's permission)
    # What the latency is made of (docs/triggers.md): the run's creation after the records, then the run.
    first_run = runs[0]
    created = (parse(first_run["queued_at"]) - produced_at).total_seconds()
    duration = (parse(first_run["end_date"]) - parse(first_run["start_date"])).total_seconds()
    print(f"\nproduce -> committed output: {latency:.1f} s (min_records="
          f"{ARRIVAL_MIN_RECORDS}, poll {ARRIVAL_POLL_SECONDS} s); first run: queued {created:.1f} s after the "
          f"records, ran {duration:.1f} s")


def test_an_unreachable_broker_or_ledger_shows_in_the_triggerer_log_and_never_stops_it(airflow, unreachable,
                                                                                       hang_up_ledger):
    """tests/dags/eo_backlog_unreachable_dag.py watches a broker that never answers and a ledger whose server
    hangs up on every connection (the listener counts them: each poll of that watcher is seen)."""
    listener, _ = hang_up_ledger
    for dag_id in ("eo_backlog_no_broker", "eo_backlog_no_ledger"):
        airflow.wait_for_dag(dag_id)

    def reported() -> list[str]:
        lines = [line for line in airflow.log_text("triggerer").splitlines()
                 if "cannot tell whether records wait" in line]
        broker = [line for line in lines if "eo_backlog_no_broker" in line and unreachable["kafka"] in line]
        ledger = [line for line in lines if "eo_backlog_no_ledger" in line and "server closed the connection" in line]
        return [*broker[:1], *ledger[:1]] if broker and ledger else []

    wait_until("both errors in the triggerer's log", lambda: len(reported()) == 2, 180, airflow)
    polls = listener.connections
    wait_until("three more polls of the ledger's watcher", lambda: listener.connections >= polls + 3, 60, airflow,
               every=0.2)
    airflow._check_alive()  # the triggerer is still running
    log = airflow.log_text("triggerer")
    for pipeline in ("eo_backlog_no_broker", "eo_backlog_no_ledger"):
        lines = [line for line in log.splitlines() if "cannot tell whether records wait" in line and pipeline in line]
        assert len(lines) == 1, lines  # once per distinct error, not at every poll
    assert "Trigger exited" not in log and "Trigger runner failed" not in log
    for dag_id in ("eo_backlog_no_broker", "eo_backlog_no_ledger"):
        assert airflow.runs(dag_id) == []
