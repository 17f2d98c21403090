"""Retention on both backends (a SQLite file and the session's real PostgreSQL): a prune killed with SIGKILL
between two of its transactions leaves a ledger the next run uses, and a prune running beside live batches
neither blocks them nor removes what they need.

The history is bulk-loaded (devtools/ledger_history.py); the batches after it go through the protocol.
The rules one by one are tests/unit/test_retention.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from airflow_exactly_once.cli.main import main as cli
from airflow_exactly_once.observe.audit import audit_pipeline
from airflow_exactly_once.core.faults import ENV as FAULTS_ENV
from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.retention import Retention, prune
from devtools.ledger_history import load_history
from tests.harness import FakeSource, MarkerWriter, Pipe, pipeline_config

ROOT = Path(__file__).resolve().parents[2]
HISTORY = 450  # batches: more than two of the CLI's prune transactions (core.retention.PRUNE_CHUNK = 200)
PARTITIONS = 3
RECORDS = 10


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_url(request, tmp_path, unique) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return request.getfixturevalue("postgres").create_database(f"retention_{unique}")


@pytest.fixture
def pipe(ledger_url, tmp_path) -> Pipe:
    """A pipeline with HISTORY committed batches behind it, keeping its newest 5 batches."""
    config = pipeline_config("p", ["t"], {"type": "parquet", "path": str(tmp_path / "out")},
                             max_records_per_partition=RECORDS, retention_batches=5, retention_days=None)
    ledger = Ledger(ledger_url)
    positions = load_history(ledger, "p", config.to_stored_dict(), fingerprint=config.fingerprint(),
                             batches=HISTORY, partitions=PARTITIONS, records=RECORDS)
    source = FakeSource({tp: end + 1_000 for tp, end in positions.items()})
    pipe = Pipe(config, ledger, lambda: source, writer_factory=MarkerWriter.of)
    yield pipe
    ledger.engine.dispose()


def run_batch(pipe: Pipe, run_id: str) -> None:
    batch = pipe.plan(run_id).batch
    pipe.write(batch.id)
    pipe.commit(batch.id)


def test_a_prune_killed_between_transactions_leaves_a_usable_ledger(pipe, ledger_url, tmp_path):
    before = pipe.ledger.committed_positions("p")
    faults = tmp_path / "faults"
    arm(faults, "prune.between_transactions", "kill", times=1)
    env = {**os.environ, FAULTS_ENV: str(faults), "PYTHONPATH": str(ROOT)}
    killed = subprocess.run([sys.executable, "-m", "airflow_exactly_once.cli", "--ledger-url", ledger_url, "prune",
                             "p", "--execute"], env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr  # SIGKILL, as a dying worker
    assert "prune.between_transactions kill" in (faults / "fired.log").read_text()

    floor = pipe.ledger.retention_floor("p")
    assert floor.batch_seq == 200  # the first transaction committed, the second never began
    assert floor.offsets == {("t", p): 200 * RECORDS for p in range(PARTITIONS)}  # where batch 200 ended
    assert before == {("t", p): HISTORY * RECORDS for p in range(PARTITIONS)}
    assert pipe.ledger.committed_positions("p") == before
    assert cli(["--ledger-url", ledger_url, "check", "p", "--without", "asset-events"]) == 0
    # The next run plans exactly where the history ended, and its commit prunes on (bounded per call).
    run_batch(pipe, "after-the-crash")
    newest = pipe.ledger.list_batches("p", limit=1)[0]
    assert newest.ranges == tuple(OffsetRange("t", p, HISTORY * RECORDS, (HISTORY + 1) * RECORDS)
                                  for p in range(PARTITIONS))
    assert pipe.coordinator.retain() is not None
    assert pipe.ledger.retention_floor("p").batch_seq == 400
    report = prune(pipe.ledger, "p", Retention.of(pipe.config))
    assert report.pruned.through == HISTORY - 4  # the newest 5 batches stay
    assert pipe.ledger.committed_positions("p") == {tp: end + RECORDS for tp, end in before.items()}
    assert audit_pipeline(pipe.ledger, "p").ok


def test_a_prune_beside_running_batches_keeps_what_they_need(pipe):
    pruned: list = []

    def pruning() -> None:  # small transactions, interleaved with the batches' compare-and-sets
        try:
            pruned.append(prune(pipe.ledger, "p", Retention(keep_batches=1, keep_days=None), chunk=20))
        except Exception as exc:  # shown by the assertion below
            pruned.append(exc)

    in_flight = pipe.plan("run-1").batch  # PLANNED while the prune runs
    thread = threading.Thread(target=pruning)
    thread.start()
    pipe.write(in_flight.id)
    pipe.commit(in_flight.id)
    for n in range(2, 4):
        run_batch(pipe, f"run-{n}")
    thread.join(timeout=120)
    assert len(pruned) == 1 and not isinstance(pruned[0], Exception), pruned
    assert pruned[0].pruned.batches >= HISTORY - 1
    assert pruned[0].pruned.transactions >= HISTORY // 20
    # How far it got depends on when the thread ran; never past the newest committed batch of its moment.
    kept = [b.seq for b in pipe.ledger.list_batches("p", newest_first=False)]
    assert HISTORY <= kept[0] <= HISTORY + 3 and kept == list(range(kept[0], HISTORY + 4)), kept
    assert pipe.ledger.committed_positions("p") == {("t", p): (HISTORY + 3) * RECORDS for p in range(PARTITIONS)}
    assert audit_pipeline(pipe.ledger, "p").ok
