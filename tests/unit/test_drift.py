"""The drift check's comparisons (observe/drift.py) on a real ledger (SQLite file), with the group's offsets and
Airflow's events given as Kafka and Airflow return them. Against a real broker and a real Airflow:
tests/system/test_pipeline_kafka.py::test_example_dag_batches_are_exact_and_mirrored_to_the_consumer_group.
"""

from __future__ import annotations

import json

import pytest

from airflow_exactly_once.cli.main import main as cli
from airflow_exactly_once.observe.drift import (
    EVENT_CLOCK_SKEW,
    GroupOffset,
    RecordedEvent,
    compare_asset_events,
    check_drift,
    compare_group,
    mirror_metadata,
)
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import Batch, OffsetRange
from airflow_exactly_once.core.retention import Retention, prune
from airflow_exactly_once.core.states import BatchState
from tests.harness import open_ledger

URI = "x-exactly-once://p"
MIRROR = "airflow-exactly-once mirror p --execute"


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    ledger = open_ledger(tmp_path / "ledger.db")
    ledger.ensure_pipeline("p", "fp", {"topics": ["t"], "sink": {"type": "parquet", "path": str(tmp_path / "o")}})
    ledger.register_partitions("p", {("t", 0): (0, "earliest"), ("t", 1): (0, "earliest")})
    return ledger


def commit(ledger: Ledger, n: int, committed: bool = True) -> Batch:
    """Batch n: offsets n*10 .. n*10+10 of both partitions, committed (or left PLANNED)."""
    epoch = ledger.pipeline("p")["epoch"]
    ranges = [OffsetRange("t", 0, n * 10, n * 10 + 10), OffsetRange("t", 1, n * 10, n * 10 + 10)]
    batch = ledger.create_batch("p", f"run-{n}", ranges, expected_epoch=epoch)
    if committed:
        ledger.mark_prepared(batch.id, ledger.claim(batch.id).epoch, {}, 20, 20)
        ledger.mark_committed(batch.id)
    return ledger.get_batch(batch.id)


def event(batch: Batch, source: str = "dag/run/notify_complete") -> RecordedEvent:
    """The event notify_complete records for `batch` (assets.batch_event_extra's shape)."""
    extra = {"batch_seq": batch.seq, "ranges": [{"topic": r.topic, "partition": r.partition, "start": r.start,
                                                 "end": r.end} for r in batch.ranges]}
    return RecordedEvent.from_extra(json.loads(json.dumps(extra)), source)


def kinds(findings) -> list[tuple[str, str, bool]]:
    return [(f.kind, f.subject, f.drift) for f in findings]


def test_a_group_at_the_ledgers_positions_is_no_drift(ledger):
    commit(ledger, 0)
    ours = mirror_metadata("p")
    held = {("t", 0): GroupOffset(10, ours), ("t", 1): GroupOffset(10, ours), ("other", 0): GroupOffset(5, "x")}
    assert compare_group(ledger, "p", "g", ["t"], held, MIRROR) == []


def test_each_kind_of_group_drift_names_its_cause_and_repair(ledger):
    commit(ledger, 0)
    commit(ledger, 1)  # positions 20, 20
    ledger.record_event("p", None, "mirror-failed", "could not mirror: GroupNotEmptyError")
    ours = mirror_metadata("p")
    findings = compare_group(ledger, "p", "g", ["t"], {("t", 0): GroupOffset(10, ours),
                                                       ("t", 1): GroupOffset(25, "auto-commit"),
                                                       ("t", 2): GroupOffset(3, "auto-commit")}, MIRROR)
    assert kinds(findings) == [("group-behind", "t[0]", True), ("group-ahead", "t[1]", True),
                               ("group-unknown-partition", "t[2]", True)]
    behind, ahead, unknown = findings
    assert "is at 10, the ledger's position is 20 (10 offsets behind)" in behind.detail
    assert "GroupNotEmptyError" in behind.cause and behind.repair == f"run `{MIRROR}`"
    assert "'auto-commit'" in ahead.cause and "stop that consumer" in ahead.repair and MIRROR in ahead.repair
    assert "--delete-offsets --group g --topic t:2" in unknown.repair
    missing = compare_group(ledger, "p", "g", ["t"], {("t", 0): GroupOffset(20, ours)}, MIRROR)
    assert kinds(missing) == [("group-missing", "t[1]", True)]
    assert "holds no offset, the ledger's position is 20" in missing[0].detail


def test_one_event_per_committed_batch_is_no_drift(ledger):
    batches = [commit(ledger, n) for n in range(3)]
    commit(ledger, 3, committed=False)  # in flight: nothing announced yet, nothing expected
    assert compare_asset_events(ledger, "p", [event(b) for b in batches], URI) == []


def test_each_kind_of_event_drift_names_its_cause_and_repair(ledger):
    b1, b2, b3, b4 = (commit(ledger, n) for n in range(4))
    planned = commit(ledger, 4, committed=False)
    shifted = RecordedEvent(b2.seq, (("t", 0, 99, 109),), "by-hand")
    events = [event(b2), event(b2), shifted, event(planned), RecordedEvent(9, (), "Airflow's API"),
              RecordedEvent.from_extra({"note": "not ours"}, "Airflow's API", "2026-11-26T10:00:00")]
    found = compare_asset_events(ledger, "p", events, URI)
    assert kinds(found) == [
        ("event-without-batch", URI, True),
        ("event-ranges-differ", f"batch {b2.seq}", True), ("event-repeated", f"batch {b2.seq}", False),
        ("event-for-uncommitted-batch", f"batch {planned.seq}", True),
        ("event-for-uncommitted-batch", "batch 9", True),
        ("events-before-history", f"batches {b1.seq}", False),
        ("event-missing", f"batches {b3.seq}, {b4.seq}", True)]
    without, differ, repeated, planned_found, unknown, older, missing = found
    assert "t[0] 99..109" in differ.detail and "t[0] 10..20, t[1] 10..20" in differ.detail
    assert "Airflow recorded 3 events" in repeated.detail and "batch_seq" in repeated.repair
    assert "the ledger holds it PLANNED" in planned_found.detail
    assert "the ledger has no such batch (its newest is 5)" in unknown.detail
    assert "another ledger" in unknown.cause
    assert "airflow db clean" in older.cause
    assert "runs run-2, run-3" in missing.detail and "clear notify_complete" in missing.repair


def test_no_event_at_all_points_at_the_outlets(ledger):
    commit(ledger, 0)
    [missing] = compare_asset_events(ledger, "p", [], URI)
    assert (missing.kind, missing.drift) == ("event-missing", True)
    assert "no outlets" in missing.cause and "exactly-once-batches" in missing.cause


def test_an_event_of_a_retracted_batch_is_a_note(ledger):
    b1 = commit(ledger, 0)
    ledger.rewind("p", expected_epoch=ledger.pipeline("p")["epoch"], retract=[b1.seq], resets={}, reason="bug 7")
    [note] = compare_asset_events(ledger, "p", [event(b1)], URI)
    assert (note.kind, note.drift) == ("event-for-retracted-batch", False)
    assert "RETRACTED" in note.detail


def test_events_are_read_from_a_little_before_the_newest_pruned_batch_only(ledger):
    """The ledger page runs the check on every view: with a pruned history, Airflow's events of pruned batches
    (never compared) are not read at all."""
    asked = []

    def read_events(since):
        asked.append(since)
        return [event(b) for b in kept]

    def check():
        return check_drift(ledger, "p", read_group=None, read_events=read_events, asset_uri=URI, mirror_command=MIRROR)

    kept = [commit(ledger, n) for n in range(3)]
    assert check().ok and asked == [None]  # nothing pruned: every event
    assert prune(ledger, "p", Retention(keep_batches=1, keep_days=None)).pruned.batches == 2
    planned = ledger.retention_floor("p").batch_created_at
    kept = kept[2:]
    assert check().ok
    since = asked[-1]
    assert since.tzinfo is not None and since.replace(tzinfo=None) == planned.replace(tzinfo=None) - EVENT_CLOCK_SKEW


def test_the_ledger_pages_window_compares_the_newest_batches_only(ledger):
    """newest_batches (the page: the batches it shows) reads and compares the events of those batches only."""
    batches = [commit(ledger, n) for n in range(5)]
    asked = []

    def read_events(since):
        asked.append(since)
        return [event(b) for b in batches[3:]]  # Airflow lost (or cleaned) the events of batches 1 to 3

    report = check_drift(ledger, "p", read_group=None, read_events=read_events, asset_uri=URI,
                         mirror_command=MIRROR, newest_batches=2)
    assert report.ok and report.compared[-1] == f"2 Asset event(s) of {URI} for the newest 2 committed batches"
    assert asked[-1].replace(tzinfo=None) == batches[3].created_at.replace(tzinfo=None) - EVENT_CLOCK_SKEW
    everything = check_drift(ledger, "p", read_group=None, read_events=read_events, asset_uri=URI,
                             mirror_command=MIRROR)
    assert asked[-1] is None and kinds(everything.findings) == [
        ("events-before-history", f"batches {batches[0].seq}, {batches[1].seq}, {batches[2].seq}", False)]


def test_the_ledger_pages_window_never_reads_every_event_airflow_holds(ledger):
    """A young (or reset) ledger holds fewer committed batches than the page's window and pruned nothing: the page
    reads the events from an hour before the pipeline was registered on, not the year Airflow may hold."""
    batches = [commit(ledger, n) for n in range(2)]
    registered = ledger.pipeline("p")["created_at"]
    asked = []

    def read_events(since):
        asked.append(since)
        return [event(b) for b in batches]

    report = check_drift(ledger, "p", read_group=None, read_events=read_events, asset_uri=URI,
                         mirror_command=MIRROR, newest_batches=50)
    assert report.ok and report.compared[-1] == f"2 Asset event(s) of {URI}"
    assert asked[-1].tzinfo is not None
    assert asked[-1].replace(tzinfo=None) == registered.replace(tzinfo=None) - EVENT_CLOCK_SKEW
    check_drift(ledger, "p", read_group=None, read_events=read_events, asset_uri=URI, mirror_command=MIRROR)
    assert asked[-1] is None  # `check` compares every event


def test_check_prints_what_it_compared_and_fails_on_drift_only(ledger, capsys):
    commit(ledger, 0)
    url = str(ledger.engine.url)
    assert cli(["--ledger-url", url, "check", "p", "--without", "asset-events"]) == 0
    out = capsys.readouterr().out
    assert "tiling OK" in out and "drift OK" in out
    assert "consumer group: none (mirror_consumer_group is not set)" in out and "Asset events: left out" in out
    assert cli(["--ledger-url", url, "--json", "check", "p", "--without", "asset-events"]) == 0
    assert json.loads(capsys.readouterr().out)["drift_ok"] is True
    assert cli(["--ledger-url", url, "mirror", "p"]) == 2
    assert "p has no mirror_consumer_group" in capsys.readouterr().err


def test_the_cli_takes_stored_secrets_from_the_pipelines_kafka_connection(monkeypatch):
    """The ledger keeps "***" for a secret; `check`, `mirror` and `rewind` take it back from the kafka connection the
    pipeline's tasks used (recorded with it), as the ledger page does, instead of asking for --kafka-conn-id."""
    import argparse

    from airflow_exactly_once.cli.connections import kafka_settings as _kafka_settings
    from airflow_exactly_once.core.config import PipelineConfig
    from airflow_exactly_once.core.errors import ConfigurationError

    secured = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "u",
               "sasl.password": "the-password"}
    monkeypatch.setenv("AIRFLOW_CONN_EO_DRIFT_KAFKA", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": "k:9092", **secured}}))
    stored = {"pipeline_id": "p", "topics": ["t"], "sink": {"type": "parquet", "path": "/o"},
              "bootstrap_servers": "k:9092", "kafka_config": {**secured, "sasl.password": "***"},
              "kafka_conn_id": "eo_drift_kafka"}
    no_options = argparse.Namespace(kafka_conn_id=None, bootstrap_servers=None)
    settings = _kafka_settings(PipelineConfig.from_dict(stored), no_options)
    assert settings.properties["sasl.password"] == "the-password" and settings.bootstrap_servers == "k:9092"
    with pytest.raises(ConfigurationError, match="names no kafka connection to take them from"):
        _kafka_settings(PipelineConfig.from_dict({**stored, "kafka_conn_id": None}), no_options)
