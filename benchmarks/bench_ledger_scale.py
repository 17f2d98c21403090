"""The ledger at scale: plan, notify_complete, the CLI's `batches` and the ledger page on a long history, before and
after pruning, against a ledger of 10 batches.

Per backend (a SQLite file, and a throwaway PostgreSQL of devtools/postgres.py), three ledgers:
  small     10 historical batches, retention on (nothing to prune);
  big       --batches historical batches over --partitions partitions, retention off;
  pruned    the big ledger after `airflow-exactly-once prune --execute` (timed; PostgreSQL: then VACUUM
            ANALYZE, as autovacuum would), retention on (--keep-batches; notify_complete then prunes what
            each new batch lets go).
`batches` prints the newest 10 (--limit 10, what the small ledger has); the ledger page shows its fixed 50
newest batches, so on the small ledger (10 + the measured ones) it renders fewer rows: its ratio holds that
constant, whatever the history's length (--small-batches 60 compares pages of 50 rows each). The history is
bulk-loaded (devtools/ledger_history.py: executemany / COPY); every measured batch goes through the protocol:
plan = core.planning.plan_batch (recovery first, then the range) on a BatchCoordinator, write = claim + stage
+ prepare (not timed), notify_complete = BatchCoordinator.commit + BatchCoordinator.retain, as
NotifyCompleteOperator runs them. `batches` is the CLI command in-process (stdout captured); the ledger page
is what its endpoint does with the ledger: LedgerReader.pipelines(), LedgerReader.report() (a read-only engine
per request, like the app), the drift check's ledger side (core.drift.check_drift; Airflow's Asset events are
left out: it reads those of its 50 newest committed batches only), the JSON of the API and the HTML. Excluded,
because they do not depend on the ledger's size: Kafka's answers (an in-memory offset source answers
partitions, log starts and ends), the sink's I/O (the Parquet marker sink of tests/harness.py writes one
small file per batch), and Airflow's authentication and permission checks around the page.

Prints each figure (median of --rounds), the ratio to the small ledger, and the load average.

    PYTHONPATH=. python benchmarks/bench_ledger_scale.py [--batches 1000000] [--partitions 12] [--rounds 15]
        [--keep-batches 1000] [--small-batches 10] [--backend sqlite|postgresql|both]
    PYTHONPATH=. python benchmarks/bench_ledger_scale.py --batches 20000 --rounds 5   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from airflow_exactly_once.cli.main import main as cli
from airflow_exactly_once.core.backlog import partition_lags
from airflow_exactly_once.core.drift import check_drift, mirror_command
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.lineage_names import pipeline_asset_uri
from airflow_exactly_once.core.planning import plan_batch
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.sinks import pipeline_committer
from airflow_exactly_once.ui.app import report_json
from airflow_exactly_once.ui.loading import DRIFT_BATCHES, DriftResult, LagResult, LedgerReader
from airflow_exactly_once.ui.page import pipeline_page
from devtools.ledger_history import load_history
from devtools.postgres import LocalPostgres
from tests.harness import FakeSource, MarkerWriter, pipeline_config

PIPELINE = "orders"
RECORDS = 100  # offsets per partition per batch
SHOWN = 10  # rows `batches` prints: as many as the small ledger has, so both print the same
OPERATIONS = ("plan", "notify_complete", "cli batches", "ledger page")


class Subject:
    """One pipeline on one ledger, run batch after batch through the protocol."""

    def __init__(self, url: str, work: Path, history: int, partitions: int, keep_batches: int | None,
                 rounds: int) -> None:
        self.url = url
        self.work = work
        self.config = self._config(keep_batches)
        self.ledger = Ledger(url)
        started = time.perf_counter()
        positions = load_history(self.ledger, PIPELINE, self.config.to_stored_dict(),
                                 fingerprint=self.config.fingerprint(), batches=history, partitions=partitions,
                                 topic=PIPELINE, records=RECORDS)
        self.load_s = time.perf_counter() - started
        self.ledger.record_dag(PIPELINE, "orders_dag")  # as the plan task does: the page needs no run-id lookup
        ends = {tp: end + RECORDS * (3 * rounds + 10) for tp, end in positions.items()}
        self.source = FakeSource(ends)
        self.runs = 0

    def _config(self, keep_batches: int | None):
        return pipeline_config(PIPELINE, [PIPELINE], {"type": "parquet", "path": str(self.work / "out")},
                               max_records_per_partition=RECORDS, retention_batches=keep_batches,
                               retention_days=None)

    def retention(self, keep_batches: int | None) -> None:
        self.config = self._config(keep_batches)

    def coordinator(self) -> BatchCoordinator:  # a new one per task, as each operator makes its own
        return BatchCoordinator(self.config, self.ledger, pipeline_committer(self.config))

    def batch(self) -> dict[str, float]:
        """One batch: plan, write (not timed), notify_complete; then the CLI's `batches` and the ledger page."""
        self.runs += 1
        timings = {}
        started = time.perf_counter()
        outcome = plan_batch(self.coordinator(), lambda: self.source, f"bench-{self.runs}")
        timings["plan"] = time.perf_counter() - started
        writer = self.coordinator()
        claimed = writer.claim(outcome.batch.id)
        writer.prepare(claimed, MarkerWriter.of(self.config).stage(None, claimed, None), RECORDS, RECORDS)
        notify = self.coordinator()
        started = time.perf_counter()
        notify.commit(outcome.batch.id)
        notify.retain()
        timings["notify_complete"] = time.perf_counter() - started
        timings["cli batches"] = timed(lambda: cli_quietly("--ledger-url", self.url, "batches", PIPELINE,
                                                           "--limit", str(SHOWN)))
        timings["ledger page"] = timed(lambda: ledger_page(self.url))
        return timings


def cli_quietly(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(list(argv))
    if code:
        raise RuntimeError(f"airflow-exactly-once {' '.join(argv)} exited {code}: {out.getvalue()[-500:]}")
    return out.getvalue()


def ledger_page(url: str) -> None:
    """What GET /exactly-once/ui and /api/pipelines/<id> do with the ledger (a new reader per request)."""
    reader = LedgerReader(url)
    now = datetime.now(timezone.utc)
    pipelines = reader.pipelines()
    report = reader.report(PIPELINE, now=now)
    lag = LagResult(partition_lags(report.committed, report.claimed, {}, {}), servers="(not asked)")
    drift = DriftResult(reader.read("the drift", lambda ledger: check_drift(
        ledger, PIPELINE, read_group=None, read_events=lambda since: [], asset_uri=pipeline_asset_uri(PIPELINE),
        mirror_command=mirror_command(PIPELINE), newest_batches=DRIFT_BATCHES)))
    report_json(report, lag, drift)
    pipeline_page(ledger=reader.description, now=now, pipelines=pipelines, report=report, lag=lag, base="/ui",
                  drift=drift)
    if reader._ledger is not None:
        reader._ledger.engine.dispose()


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def measure(subject: Subject, rounds: int) -> dict[str, float]:
    subject.batch()  # warm up: imports, first connections, the schema check of a new engine
    samples = [subject.batch() for _ in range(rounds)]
    return {op: statistics.median(s[op] for s in samples) for op in OPERATIONS}


def run_backend(name: str, urls: Callable[[str], str], work: Path, args: argparse.Namespace) -> None:
    print(f"\n== {name}: {args.batches:,} historical batches x {args.partitions} partitions "
          f"(retention keeps {args.keep_batches:,}) ==", flush=True)
    big = Subject(urls("big"), work / f"{name}-big", args.batches, args.partitions, None, args.rounds)
    small = Subject(urls("small"), work / f"{name}-small", args.small_batches, args.partitions, args.keep_batches,
                    args.rounds)
    os.sync()  # the big load's writeback would otherwise slow the small ledger's commits (SQLite syncs each one)
    print(f"loaded: small in {small.load_s:.1f} s, big in {big.load_s:.1f} s", flush=True)
    reference = f"small ({args.small_batches} batches)"
    rows = {reference: measure(small, args.rounds),
            f"big ({args.batches:,} batches), retention off": measure(big, args.rounds)}
    started = time.perf_counter()
    pruned = cli_quietly("--ledger-url", big.url, "prune", PIPELINE, "--keep-batches", str(args.keep_batches),
                         "--keep-days", "none", "--execute")
    print(f"prune --execute: {time.perf_counter() - started:.1f} s; {pruned.strip().splitlines()[-1]}", flush=True)
    if big.ledger.engine.dialect.name == "postgresql":
        # What autovacuum does within a minute of a prune this size (20% of the table dead): without it the
        # first queries after the prune step over the dead index entries. Steady pruning (notify_complete's 50
        # batches at a time) leaves too few dead rows to matter.
        with big.ledger.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
    big.retention(args.keep_batches)
    rows[f"big after prune, retention on (keeps {args.keep_batches:,})"] = measure(big, args.rounds)
    base = rows[reference]
    print(f"{'ledger':<52}" + "".join(f"{op:>24}" for op in OPERATIONS))
    for label, figures in rows.items():
        print(f"{label:<52}" + "".join(f"{figures[op] * 1000:>12.1f} ms {figures[op] / base[op]:>7.2f}x"
                                       for op in OPERATIONS))
    for subject in (small, big):
        subject.ledger.engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=1_000_000, help="historical batches of the big ledger")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=15, help="measured batches per ledger (the median is shown)")
    parser.add_argument("--keep-batches", type=int, default=1000, help="retention_batches after the prune")
    parser.add_argument("--small-batches", type=int, default=10,
                        help="historical batches of the small ledger (60: the page shows as many rows as on the big)")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    args = parser.parse_args()
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="aeo-bench-ledger-"))
    try:
        if args.backend in ("sqlite", "both"):
            run_backend("SQLite", lambda db: f"sqlite:///{work / (db + '.db')}", work, args)
        if args.backend in ("postgresql", "both"):
            server = LocalPostgres(work / "pg").start()
            try:
                run_backend("PostgreSQL", server.create_database, work, args)
            finally:
                server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nload average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
