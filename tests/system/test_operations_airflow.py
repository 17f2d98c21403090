"""Day-to-day operations, end to end, with Airflow driving the runs (issue 5).

Real Kafka broker, real Spark (local mode in the task process), real Airflow scheduler,
driven through the REST API the UI uses: a backfill of three data intervals
(POST /api/v2/backfills), a cleared interval re-run, a manual re-run of a processed
interval, startup by timestamp with the ledger winning afterwards, a partition added
between runs, an empty run, a rewind with the console script followed by reprocessing, and
a topic recreated under both data-loss policies.
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError, UnknownTopicOrPartitionError

from airflow_exactly_once.observe.audit import audit_pipeline
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.timestamps import to_epoch_ms
from tests.harness import airflow_ledger, asset_events, operator_cli as cli
from tests.helpers import assert_exactly_once, read_parquet, staging_leftovers, values_of

CONTINUATION = "eo_ops_continuation"
INTERVAL = "eo_ops_interval"
DAY = "2024-01-01T"



def make_topic(kafka, name: str, partitions: int) -> None:
    """A topic without time retention: the tests use record timestamps from the past on purpose."""
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                admin.create_topics([NewTopic(name, partitions, 1, topic_configs={"retention.ms": "-1"})])
                return
            except TopicAlreadyExistsError:  # a deletion of the same name is still in progress
                assert time.monotonic() < deadline, f"topic {name} could not be recreated"
                time.sleep(1)
    finally:
        admin.close()


def delete_topic(kafka, name: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        admin.delete_topics([name])
        deadline = time.monotonic() + 60
        while name in admin.list_topics():
            assert time.monotonic() < deadline, f"topic {name} was never deleted"
            time.sleep(0.5)
    except UnknownTopicOrPartitionError:
        pass
    finally:
        admin.close()


def send(kafka, topic: str, records: list[tuple[int, str, int]]) -> list[str]:
    """(partition, value, timestamp ms) per record; returns the values."""
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    for partition, value, ts in records:
        producer.send(topic, value=value.encode(), partition=partition, timestamp_ms=ts)
    producer.flush()
    producer.close()
    return [value for _, value, _ in records]


def send_in_transactions(kafka, topic: str, batches: list[tuple[list[str], bool]]) -> list[str]:
    """Each (values, commit?) in its own transaction on partition 0; returns the committed values.

    Transaction markers take offsets and aborted records stay in the log: gaps that are not data.
    """
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, transactional_id=f"tx-{topic}")
    producer.init_transactions()
    committed = []
    for values, commit in batches:
        producer.begin_transaction()
        for value in values:
            producer.send(topic, value=value.encode(), partition=0, timestamp_ms=at("01:00"))
        producer.flush()
        if commit:
            producer.commit_transaction()
            committed += values
        else:
            producer.abort_transaction()
    producer.close()
    return committed



def values_by_batch(output: Path) -> dict[int, list[str]]:
    found: dict[int, list[str]] = defaultdict(list)
    for row in read_parquet(output):
        found[int(row["batch_seq"])].append(row["v"])
    return {seq: sorted(values) for seq, values in found.items()}


def run_path(dag: str, run_id: str) -> str:
    return f"/dags/{dag}/dagRuns/{quote(run_id, safe='')}"


def wait_run(airflow, dag: str, run_id: str, timeout: float = 900) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = airflow.api("GET", run_path(dag, run_id))
        if run["state"] in ("success", "failed"):
            return run
        assert time.monotonic() < deadline, f"run {run_id} of {dag} did not finish: {run}"
        time.sleep(2)


def task_states(airflow, dag: str, run_id: str) -> dict[str, str]:
    tis = airflow.api("GET", run_path(dag, run_id) + "/taskInstances")["task_instances"]
    return {ti["task_id"].rpartition(".")[2]: ti["state"] for ti in tis}


def at(hour_minute: str) -> int:
    return to_epoch_ms(DAY + hour_minute + ":00Z")


def test_backfill_three_intervals_then_rerun_them(kafka, airflow, tmp_path, unique, warm_spark):
    name = f"backfill-{unique}"
    make_topic(kafka, name, partitions=2)
    sent: dict[str, list[str]] = {}
    for hour, count in (("00", 4), ("01", 6), ("02", 8), ("03", 10), ("04", 4)):
        sent[hour] = send(kafka, name, [(i % 2, f"h{hour}-{i}", at(f"{hour}:{10 + i:02d}")) for i in range(count)])
    output = tmp_path / name
    conf = {"pipeline_id": name, "topic": name, "output": str(output), "interval_rerun": "replace", **warm_spark}
    airflow.wait_for_dag(INTERVAL)

    # What the UI's backfill dialog sends: hours 01, 02 and 03, three runs at a time.
    backfill = airflow.api("POST", "/backfills", {
        "dag_id": INTERVAL, "from_date": DAY + "01:00:00Z", "to_date": DAY + "03:00:00Z",
        "dag_run_conf": conf, "max_active_runs": 3, "reprocess_behavior": "none"})
    created = airflow.api("GET", f"/dags/{INTERVAL}/dagRuns?run_type=backfill&limit=100")["dag_runs"]
    runs = {run["data_interval_start"][11:13]: run["dag_run_id"] for run in created}
    assert sorted(runs) == ["01", "02", "03"], created
    finished = {hour: wait_run(airflow, INTERVAL, run_id) for hour, run_id in runs.items()}
    assert {hour: run["state"] for hour, run in finished.items()} == dict.fromkeys(runs, "success")
    assert all(run["run_type"] == "backfill" for run in finished.values())
    assert backfill["dag_run_conf"] == conf
    # Runs of different intervals ran side by side (max_active_runs=3).
    starts = [datetime.fromisoformat(run["start_date"]) for run in finished.values()]
    ends = [datetime.fromisoformat(run["end_date"]) for run in finished.values()]
    assert max(starts) < min(ends), "the three interval runs never overlapped"

    ledger = airflow_ledger(airflow)
    by_batch = values_by_batch(output)
    batches = {hour: ledger.interval_batches(name, (at(f"{hour}:00"), at(f"{int(hour) + 1:02d}:00")))
               for hour in runs}
    for hour, found in batches.items():
        [batch] = found
        assert batch.state is BatchState.COMMITTED and batch.run_id == runs[hour]
        assert by_batch[batch.seq] == sorted(sent[hour]), f"interval {hour}:00 is not exact"
        assert batch.input_records == batch.output_records == len(sent[hour])
    assert_exactly_once(sent["01"] + sent["02"] + sent["03"], values_of(output))
    assert audit_pipeline(ledger, name).ok

    # Each committed batch is an Asset event with its counts and offsets.
    events = asset_events(airflow, INTERVAL)
    extras = sorted((e["extra"]["batch_seq"], e["extra"]["output_records"]) for e in events)
    assert extras == sorted((b[0].seq, len(sent[h])) for h, b in batches.items())
    assert {e["uri"] for e in events} == {f"x-exactly-once://{name}"}
    assert all(e["extra"]["ranges"] and e["extra"]["interval"] for e in events)

    # Clearing a committed interval (interval_rerun="replace"): same range, output replaced.
    old = batches["02"][0]
    airflow.clear(INTERVAL, runs["02"])
    assert wait_run(airflow, INTERVAL, runs["02"])["state"] == "success"
    newest, replaced = ledger.interval_batches(name, (at("02:00"), at("03:00")))
    assert replaced.seq == old.seq and replaced.state is BatchState.RETRACTED
    assert newest.state is BatchState.COMMITTED and newest.ranges == old.ranges
    assert newest.details["replaces"] == old.seq
    by_batch = values_by_batch(output)
    assert old.seq not in by_batch and by_batch[newest.seq] == sorted(sent["02"])
    assert_exactly_once(sent["01"] + sent["02"] + sent["03"], values_of(output))
    assert "replacing batch" in airflow.task_log(INTERVAL, runs["02"], "plan")

    # Another run of hour 01, with interval_rerun="noop": a recorded no-op, nothing written.
    airflow.api("POST", f"/dags/{INTERVAL}/dagRuns", {
        "dag_run_id": f"{name}-rerun-01", "logical_date": DAY + "01:30:00Z",
        "data_interval_start": DAY + "01:00:00Z", "data_interval_end": DAY + "02:00:00Z",
        "conf": {**conf, "interval_rerun": "noop"}})
    assert wait_run(airflow, INTERVAL, f"{name}-rerun-01")["state"] == "success"
    assert task_states(airflow, INTERVAL, f"{name}-rerun-01") == {
        "plan": "skipped", "write": "skipped", "notify_complete": "skipped", "abort": "skipped"}
    assert len(ledger.interval_batches(name, (at("01:00"), at("02:00")))) == 1
    assert any(e["kind"] == "interval-rerun-noop" and f"{name}-rerun-01" in e["message"]
               for e in ledger.list_events(name))
    assert_exactly_once(sent["01"] + sent["02"] + sent["03"], values_of(output))
    assert staging_leftovers(output) == []
    report = audit_pipeline(ledger, name)
    assert report.ok, report.problems
    # Only the backfill and the manual run ran it: the scheduler never started runs of its own,
    # and the example hourly DAG waits, paused, for someone to unpause it.
    kinds = {run["run_type"] for run in airflow.api("GET", f"/dags/{INTERVAL}/dagRuns?limit=100")["dag_runs"]}
    assert kinds == {"backfill", "manual"}
    assert airflow.api("GET", "/dags/kafka_to_parquet_hourly")["is_paused"] is True


def test_startup_timestamp_empty_run_rewind_and_new_partition(kafka, airflow, tmp_path, unique, warm_spark):
    name = f"ops-{unique}"
    make_topic(kafka, name, partitions=2)
    old = send(kafka, name, [(i % 2, f"old-{i}", at("00:00")) for i in range(20)])
    new = send(kafka, name, [(i % 2, f"new-{i}", at("01:00")) for i in range(30)])
    output = tmp_path / name
    conf = {"pipeline_id": name, "topic": name, "output": str(output), "startup_mode": "timestamp",
            "startup_timestamp": DAY + "00:30:00Z", **warm_spark}
    airflow.wait_for_dag(CONTINUATION)
    assert airflow.run(CONTINUATION, f"{name}-1", conf) == "success"
    assert_exactly_once(new, values_of(output))  # startup by timestamp: the old records are not read
    assert "starts at offset 10 (startup mode timestamp 2024-01-01T00:30:00Z)" in airflow.task_log(
        CONTINUATION, f"{name}-1", "plan")

    # Nothing new: the run succeeds, the batch tasks are skipped, the ledger shows an EMPTY batch.
    assert airflow.run(CONTINUATION, f"{name}-2", conf) == "success"
    assert task_states(airflow, CONTINUATION, f"{name}-2") == {
        "plan": "skipped", "write": "skipped", "notify_complete": "skipped", "abort": "skipped"}
    ledger = airflow_ledger(airflow)
    assert [b.state for b in ledger.list_batches(name, newest_first=False)] == [
        BatchState.COMMITTED, BatchState.EMPTY]
    listing = cli(airflow, "batches", name)
    assert listing.returncode == 0, listing.stderr
    assert f"2    EMPTY      {name}-2" in listing.stdout

    # Rewind to 00:30 (say the transform had a bug): a dry run first, then for real.
    dry = cli(airflow, "rewind", name, "--to-time", DAY + "00:30:00Z")
    assert dry.returncode == 0, dry.stderr
    assert "committed batches withdrawn from the sink: 1 (30 records)" in dry.stdout
    assert "dry run: nothing changed" in dry.stdout and len(values_of(output)) == 30
    done = cli(airflow, "rewind", name, "--to-time", DAY + "00:30:00Z", "--reason", "bug 42", "--execute")
    assert done.returncode == 0, done.stderr
    assert values_of(output) == []  # batch 1's output is withdrawn
    assert ledger.list_batches(name)[-1].state is BatchState.RETRACTED

    # Meanwhile a partition is added and more records arrive. The next run says
    # startup_mode="earliest", but the ledger wins: the old records stay unread; the new
    # partition starts at its earliest offset; the rewound range is processed again.
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        admin.create_partitions({name: 3})
    finally:
        admin.close()
    later = send(kafka, name, [(i % 3, f"later-{i}", at("02:00")) for i in range(12)])
    conf_earliest = {**conf, "startup_mode": "earliest", "startup_timestamp": None}
    assert airflow.run(CONTINUATION, f"{name}-3", conf_earliest) == "success"
    assert_exactly_once(new + later, values_of(output))  # reprocessed exactly once, old never read
    assert not set(old) & set(values_of(output))
    assert ledger.initial_offsets(name)[(name, 2)] == 0
    assert [b.state for b in ledger.list_batches(name, newest_first=False)] == [
        BatchState.RETRACTED, BatchState.EMPTY, BatchState.COMMITTED]
    check = cli(airflow, "check", name)
    assert check.returncode == 0 and "tiling OK" in check.stdout, check.stdout + check.stderr
    assert "rewind after batch 2" in check.stdout and "bug 42" in check.stdout
    # Airflow's Asset events agree with the ledger; batch 1's was announced before the rewind withdrew it
    assert "drift OK" in check.stdout and "note event-for-retracted-batch batch 1: " in check.stdout, check.stdout
    refused = cli(airflow, "rewind", name, "--to-offsets", f"{name}:0=999", "--execute")
    assert refused.returncode == 2 and "past the committed position" in refused.stderr
    shown = cli(airflow, "show", name, "3")
    assert f"{name}[2]  0..4  (4 offsets)" in shown.stdout and "42 read, 42 written" in shown.stdout

    [event] = asset_events(airflow, CONTINUATION, f"{name}-3")
    assert event["extra"]["output_records"] == 42 and event["extra"]["batch_seq"] == 3
    assert {(r["partition"], r["start"], r["end"]) for r in event["extra"]["ranges"]} == {
        (0, 10, 29), (1, 10, 29), (2, 0, 4)}
    assert "notify_complete: batch" in airflow.task_log(CONTINUATION, f"{name}-3", "notify_complete")
    assert staging_leftovers(output) == []


def test_topic_recreated_fails_loudly_then_skip_is_recorded(kafka, airflow, tmp_path, unique, warm_spark):
    name = f"recreated-{unique}"
    make_topic(kafka, name, partitions=1)
    send(kafka, name, [(0, f"first-{i}", at("00:00")) for i in range(30)])
    output = tmp_path / name
    conf = {"pipeline_id": name, "topic": name, "output": str(output), "startup_mode": "latest", **warm_spark}
    airflow.wait_for_dag(CONTINUATION)
    assert airflow.run(CONTINUATION, f"{name}-1", conf) == "success"  # latest: nothing yet, position 30
    ledger = airflow_ledger(airflow)
    assert [b.state for b in ledger.list_batches(name)] == [BatchState.EMPTY]

    delete_topic(kafka, name)
    make_topic(kafka, name, partitions=1)
    # The new topic's records come in transactions, one aborted: offsets 0..15 hold 10 records.
    fresh = send_in_transactions(kafka, name, [([f"fresh-{i}" for i in range(5)], True),
                                               (["aborted-0", "aborted-1", "aborted-2"], False),
                                               ([f"fresh-{i}" for i in range(5, 10)], True)])
    assert airflow.run(CONTINUATION, f"{name}-2", conf) == "failed"  # data_loss_policy="fail"
    assert (f"Data loss: the committed offset 30 of {name}[0] is beyond the end of the log (16)"
            in airflow.task_log(CONTINUATION, f"{name}-2", "plan"))
    assert task_states(airflow, CONTINUATION, f"{name}-2")["plan"] == "failed"
    assert len(ledger.list_batches(name)) == 1 and ledger.committed_positions(name) == {(name, 0): 30}

    assert airflow.run(CONTINUATION, f"{name}-3", {**conf, "data_loss_policy": "skip"}) == "success"
    assert_exactly_once(fresh, values_of(output))
    # Transaction markers and aborted records are gaps in offsets, not data loss.
    skipped = ledger.list_batches(name)[0]
    assert skipped.offset_span == 16 and skipped.input_records == skipped.output_records == 10
    assert [r["kind"] for r in ledger.position_resets(name)] == ["data-loss-skip"]
    assert any(e["kind"] == "data-loss-skipped" for e in ledger.list_events(name))
    # The next run continues after the recreated topic's records: nothing is read twice.
    assert airflow.run(CONTINUATION, f"{name}-4", {**conf, "data_loss_policy": "skip"}) == "success"
    assert ledger.list_batches(name)[0].state is BatchState.EMPTY
    assert_exactly_once(fresh, values_of(output))
    report = audit_pipeline(ledger, name)
    assert report.ok and report.notes and "30 -> 0" in report.notes[0], report
