"""A ledger written by an earlier release keeps working: migrated (also after a killed upgrade), then run on.

Starts from the checked-in fixtures (tests/fixtures/ledger/<release>/, made by devtools/ledger_fixtures.py
with that release's code) on real SQLite and real PostgreSQL. The next batches run through the protocol core
(BatchCoordinator, planning) with the unit tier's fakes for Kafka and the sink (FakeSource, the Parquet marker
sink): what is under test is the ledger, and the fixture's sink folder holds the PREPARED batch's staged files.
Every schema change adds a migration and extends this test (a fixture of the release before the change);
0002 (retention) is checked by pruning the upgraded ledger at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from airflow_exactly_once.observe.audit import audit_pipeline
from airflow_exactly_once.core.errors import LedgerVersionError
from airflow_exactly_once.core.faults import ENV as FAULTS_ENV
from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.ledger import Ledger, versioning
from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.retention import Retention, prune
from airflow_exactly_once.core.states import BatchState
from devtools.ledger_fixtures import ENDS, OUTPUT_PLACEHOLDER, PIPELINE, ledger_facts, scenario_config
from tests.harness import FakeSource, MarkerWriter, Pipe

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ledger"
RELEASES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request) -> str:
    return request.param


def load_fixture(release: str, backend: str, tmp_path: Path, request) -> tuple[str, Path]:
    """The release's ledger on `backend` and its sink folder, both in this test's own places; returns (url, output)."""
    folder = FIXTURES / release
    output = tmp_path / "output"
    shutil.copytree(folder / "output", output)
    dump = (folder / f"{backend}.sql").read_text().replace(OUTPUT_PLACEHOLDER, str(output))
    if backend == "sqlite":
        path = tmp_path / "ledger.db"
        with sqlite3.connect(path) as conn:
            conn.executescript(dump)
        return f"sqlite:///{path}", output
    postgres = request.getfixturevalue("postgres")
    name = f"upgrade_{uuid.uuid4().hex[:8]}"
    url = postgres.create_database(name)
    postgres.psql(dump, name)
    return url, output


def cli(url: str, *args: str, faults: Path | None = None) -> subprocess.CompletedProcess:
    """The console script in a real process of its own (so a fault point can SIGKILL it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(FAULTS_ENV, None)
    if faults is not None:
        env[FAULTS_ENV] = str(faults)
    return subprocess.run([sys.executable, "-m", "airflow_exactly_once.cli", "--ledger-url", url, *args],
                          capture_output=True, text=True, env=env, timeout=120, cwd=REPO)


@pytest.mark.parametrize("release", RELEASES)
def test_a_ledger_of_an_earlier_release_survives_a_killed_upgrade_and_runs_on(release, backend, tmp_path, request):
    scenario = json.loads((FIXTURES / release / "scenario.json").read_text())
    url, output = load_fixture(release, backend, tmp_path, request)
    before = Ledger(url).schema_version()
    assert before.state in ("unversioned", "behind")

    # Readers (the ledger page, the backlog trigger) never migrate: they say what to do.
    with pytest.raises(LedgerVersionError, match="airflow-exactly-once db upgrade"):
        Ledger.read_only(url).has_schema()

    # `db upgrade` killed after a migration step, before its transaction commits: the old version is intact.
    faults = tmp_path / "faults"
    arm(faults, "ledger.migrate.after_step")
    killed = cli(url, "db", "upgrade", faults=faults)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "ledger.migrate.after_step kill" in (faults / "fired.log").read_text()
    assert Ledger(url).schema_version() == before

    # The next batches, on a ledger this code opens for the first time: it upgrades on first use.
    ledger = Ledger(url)
    source = FakeSource(dict(ENDS))
    pipe = Pipe(scenario_config(output), ledger, lambda: source, writer_factory=MarkerWriter.of)
    early = ledger_facts(ledger, positions=False)  # committed positions read revision 0002's floor: not yet
    assert {k: scenario[k] for k in early} == early  # nothing lost by the crash
    prepared = BatchId(PIPELINE, max(int(s) for s, state in scenario["states"].items() if state == "PREPARED"))
    outcome = pipe.plan("run-next-1")
    assert ledger.schema_version().state == "current"
    assert pipe.state(prepared) is BatchState.COMMITTED  # recovered by the first plan, then planning went on
    seqs = []
    while outcome.action == "planned":
        seqs.append(outcome.batch.seq)
        pipe.write(outcome.batch.id)
        pipe.commit(outcome.batch.id)
        outcome = pipe.plan(f"run-next-{len(seqs) + 1}")
    assert outcome.action == "empty" and seqs[0] == prepared.seq + 1

    # Offsets continue exactly: every offset of every partition committed once, in the ledger and in the output.
    positions = {f"{t}:{p}": end for (t, p), end in ENDS.items()}
    assert ledger_facts(ledger)["committed_positions"] == positions
    report = audit_pipeline(ledger, PIPELINE)
    assert report.ok, report.problems
    published = {(t, p): [] for (t, p) in ENDS}
    for manifest in sorted((output / "_manifest").glob("batch-*.json")):
        for r in json.loads(manifest.read_text())["ranges"]:
            published[(r["topic"], r["partition"])].extend(range(r["start"], r["end"]))
    assert published == {tp: list(range(end)) for tp, end in ENDS.items()}

    # The earlier release's history is all still there.
    after = ledger_facts(ledger)
    for seq, state in scenario["states"].items():
        assert after["states"][seq] == ("COMMITTED" if state == "PREPARED" else state)
        assert after["ranges"][seq] == scenario["ranges"][seq]
    assert after["bad_records"] == scenario["bad_records"]
    kinds = after["events"]
    assert kinds[:len(scenario["events"])] == scenario["events"] and "recovered" in kinds
    # 0002 (retention): the upgraded ledger prunes its history down to a floor, and positions and tiling hold.
    pruned = prune(ledger, PIPELINE, Retention(keep_batches=1, keep_days=None), chunk=2)
    assert pruned.pruned.through == seqs[-1] - 1 and pruned.pruned.transactions > 1
    assert [b.seq for b in ledger.list_batches(PIPELINE, newest_first=False)] == [seqs[-1], seqs[-1] + 1]
    assert ledger_facts(ledger)["committed_positions"] == positions and audit_pipeline(ledger, PIPELINE).ok
    with ledger.engine.connect() as conn:
        assert versioning.schema_differences(conn) == []
    assert Ledger.read_only(url).has_schema()
    done = cli(url, "db", "upgrade")
    assert done.returncode == 0 and "already at" in done.stdout, done.stderr


def test_the_head_of_the_migrations_is_exactly_schema_py_on_postgresql(postgres):
    url = postgres.create_database(f"head_{uuid.uuid4().hex[:8]}")
    ledger = Ledger(url)
    ledger.create_schema()
    with ledger.engine.connect() as conn:
        assert versioning.schema_differences(conn) == []
        conn.exec_driver_sql("ALTER TABLE aeo_event ALTER COLUMN kind TYPE VARCHAR(80)")
        assert [d[0][0] for d in versioning.schema_differences(conn)] == ["modify_type"]
        conn.rollback()


def test_writers_starting_at_once_on_an_earlier_ledger_upgrade_it_once(backend, tmp_path, request):
    """The schema lock (advisory lock / BEGIN IMMEDIATE) serialises the upgrades of tasks that start together."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    url, _output = load_fixture(RELEASES[-1], backend, tmp_path, request)
    epoch = Ledger(url).pipeline(PIPELINE)["epoch"]
    ledgers = [Ledger(url) for _ in range(6)]
    barrier = Barrier(len(ledgers))

    def first_use(ledger: Ledger) -> int:
        barrier.wait()
        return ledger.ensure_pipeline(PIPELINE, ledger.pipeline(PIPELINE)["fingerprint"], {})

    try:
        with ThreadPoolExecutor(len(ledgers)) as pool:
            assert list(pool.map(first_use, ledgers)) == [epoch] * len(ledgers)
    finally:
        for ledger in ledgers:
            ledger.engine.dispose()
    ledger = Ledger(url)
    with ledger.engine.connect() as conn:
        assert conn.exec_driver_sql(f"SELECT version_num FROM {versioning.VERSION_TABLE}").scalars().all() == [
            versioning.head_revision()]
