"""The ledger page's drift section against Airflow's real metadata database (PostgreSQL with the schema of
`airflow db migrate`, as devtools/airflow_stack.py runs it): a view reads a bounded part of the Asset events,
however many Airflow holds. The figures on a year of history: benchmarks/bench_ledger_scale.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from airflow.models.asset import AssetEvent, AssetModel
from sqlalchemy.orm import Session

from airflow_exactly_once.observe.backlog import read_pipeline
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.lineage_names import pipeline_asset_uri
from airflow_exactly_once.ui.loading import DRIFT_EVENTS, LedgerReader, read_drift
from devtools.airflow_stack import AirflowStack
from tests.harness import open_ledger
from tests.unit.test_drift import commit

PIPELINE = "p"  # tests.unit.test_drift's batches


@pytest.fixture
def airflow_db(airflow_database, tmp_path, unique) -> sa.Engine:
    """A database of its own on the session's Airflow metadata server, with Airflow's schema and the Asset."""
    url = airflow_database.create_database(f"drift_events_{unique}")
    AirflowStack(tmp_path / "airflow", [], database_url=url).cli(["db", "migrate"])
    engine = sa.create_engine(url)
    with Session(engine) as session, session.begin():
        session.add(AssetModel(uri=pipeline_asset_uri(PIPELINE), name=pipeline_asset_uri(PIPELINE)))
    yield engine
    engine.dispose()


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    ledger = open_ledger(tmp_path / "ledger.db")
    ledger.ensure_pipeline(PIPELINE, "fp", {"topics": ["t"], "sink": {"type": "parquet", "path": str(tmp_path)}})
    ledger.register_partitions(PIPELINE, {("t", 0): (0, "earliest"), ("t", 1): (0, "earliest")})
    return ledger


def record(engine: sa.Engine, events: list[tuple[int, list[tuple[int, int]], datetime]]) -> None:
    """Asset events as notify_complete records them: (batch_seq, per partition of topic t (start, end), when)."""
    with Session(engine) as session, session.begin():
        asset_id = session.scalar(sa.select(AssetModel.id).where(AssetModel.uri == pipeline_asset_uri(PIPELINE)))
        session.execute(sa.insert(AssetEvent), [
            {"asset_id": asset_id, "timestamp": at, "source_dag_id": "d", "source_run_id": f"r{seq}",
             "source_task_id": "notify_complete",
             "extra": {"batch_seq": seq, "ranges": [{"topic": "t", "partition": p, "start": start, "end": end}
                                                    for p, (start, end) in enumerate(ranges)]}}
            for seq, ranges, at in events])


def view(ledger, engine: sa.Engine):
    reader = LedgerReader(str(ledger.engine.url))
    report = read_pipeline(ledger, PIPELINE, now=datetime.now(timezone.utc), commit_deadline_ms=None)
    with Session(engine) as session:
        return read_drift(reader, report, session)


def test_a_new_ledger_beside_a_year_of_events_reads_only_those_since_it_was_registered(ledger, airflow_db):
    """Fewer committed batches than the page shows and nothing pruned: the events a year old (another ledger's,
    numbered from 1 too) are not read; with them, the page would report batches 1 and 2 as announced with other
    ranges."""
    batches = [commit(ledger, n) for n in range(2)]
    long_ago = datetime.now(timezone.utc) - timedelta(days=365)
    record(airflow_db, [(seq, [(0, 5), (0, 5)], long_ago + timedelta(minutes=seq)) for seq in range(1, 301)])
    record(airflow_db, [(b.seq, [(r.start, r.end) for r in b.ranges], datetime.now(timezone.utc)) for b in batches])
    drift = view(ledger, airflow_db)
    assert drift.errors == [] and drift.report.ok, [f.describe() for f in drift.report.findings]
    assert drift.report.compared[-1] == f"2 Asset event(s) of {pipeline_asset_uri(PIPELINE)}"


def test_the_page_reads_at_most_its_bound_of_events_and_says_so(ledger, airflow_db):
    """Airflow holds more events since the window began than the ledger's batches explain (another ledger's
    batches 101 on, as when the page reads a stale ledger): the newest DRIFT_EVENTS are compared, the page says
    that older ones were not, and each is reported without a ledger lookup of its own."""
    batches = [commit(ledger, n) for n in range(2)]
    now = datetime.now(timezone.utc)
    others = DRIFT_EVENTS + 200
    record(airflow_db, [(100 + i, [(0, 5), (0, 5)], now - timedelta(seconds=others - i)) for i in range(1, others + 1)])
    record(airflow_db, [(b.seq, [(r.start, r.end) for r in b.ranges], now + timedelta(seconds=1)) for b in batches])
    drift = view(ledger, airflow_db)
    assert len(drift.errors) == 1 and f"newest {DRIFT_EVENTS:,}" in drift.errors[0], drift.errors
    assert f"airflow-exactly-once check {PIPELINE}" in drift.errors[0]
    assert drift.report.compared[-1] == f"{DRIFT_EVENTS} Asset event(s) of {pipeline_asset_uri(PIPELINE)}"
    unknown = [f for f in drift.report.findings if f.kind == "event-for-uncommitted-batch"]
    seqs = sorted(int(f.subject.split()[1]) for f in unknown)
    assert seqs == list(range(100 + others - DRIFT_EVENTS + 3, 100 + others + 1))  # the newest, ours among them
    assert all("the ledger has no such batch (its newest is 2)" in f.detail for f in unknown)
    assert not [f for f in drift.report.findings if f.kind == "event-missing"]  # our batches' events were read
