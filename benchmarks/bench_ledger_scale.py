"""The ledger at scale: plan, notify_complete, the CLI's `batches` and the ledger page (without and with its drift
section, Airflow's Asset events included) on a long history, before and after pruning, against a ledger of 10 batches.

Per backend (a SQLite file, and a throwaway PostgreSQL of devtools/postgres.py), three ledgers:
  small     10 historical batches, retention on (nothing to prune);
  big       --batches historical batches over --partitions partitions, retention off;
  pruned    the big ledger after `airflow-exactly-once prune --execute` (timed; PostgreSQL: then VACUUM
            ANALYZE, as autovacuum would), retention on (--keep-batches; notify_complete then prunes what
            each new batch lets go).
Beside each ledger, an Airflow metadata database on PostgreSQL (devtools/airflow_stack.metadata_server, its
schema made by `airflow db migrate`) holds the pipeline's Asset and one Asset event per committed batch, as
notify_complete records it (assets.batch_event_extra, timestamped when the batch committed): the history's
are bulk-loaded (COPY), each measured batch's is inserted after its notify_complete. `--batches 525600` is a
year of runs every minute.
`batches` prints the newest 10 (--limit 10, what the small ledger has); the ledger page shows its fixed 50
newest batches, so on the small ledger (10 + the measured ones) it renders fewer rows: its ratio holds that
constant, whatever the history's length (--small-batches 60 compares pages of 50 rows each). The history is
bulk-loaded (devtools/ledger_history.py: executemany / COPY); every measured batch goes through the protocol:
plan = core.planning.plan_batch (recovery first, then the range) on a BatchCoordinator, write = claim + stage
+ prepare (not timed), notify_complete = BatchCoordinator.commit + BatchCoordinator.retain, as
NotifyCompleteOperator runs them. `batches` is the CLI command in-process (stdout captured); the ledger page
is what its endpoint does with the ledger: LedgerReader.pipelines(), LedgerReader.report() (a read-only engine
per request, like the app), the JSON of the API and the HTML; "page with drift" adds the drift section as the
endpoint reads it (ui.loading.read_drift: the ledger's 50 newest committed batches against the Asset events
read from Airflow's database in a session of its own, like the api-server's per request), and checks that it
found no drift. One more row: the small ledger's page with drift beside the big history's Airflow database
(a new or reset ledger beside a year of events). Excluded, because they do not depend on the ledger's size:
Kafka's answers (an in-memory offset source answers partitions, log starts and ends; no consumer group is
mirrored), the sink's I/O (the Parquet marker sink of tests/harness.py writes one small file per batch), and
Airflow's authentication and permission checks around the page.

Prints each figure (median of --rounds), the ratio to the small ledger, and the load average.

    PYTHONPATH=. python benchmarks/bench_ledger_scale.py [--batches 1000000] [--partitions 12] [--rounds 15]
        [--keep-batches 1000] [--small-batches 10] [--backend sqlite|postgresql|both]
    PYTHONPATH=. python benchmarks/bench_ledger_scale.py --batches 20000 --rounds 5   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

import sqlalchemy as sa
from sqlalchemy.orm import Session

from airflow_exactly_once.airflow_integration.assets import batch_event_extra
from airflow_exactly_once.cli.main import main as cli
from airflow_exactly_once.observe.backlog import partition_lags
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.lineage_names import pipeline_asset_uri
from airflow_exactly_once.core.model import Batch, BatchId, OffsetRange
from airflow_exactly_once.core.planning import plan_batch
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.sinks import pipeline_committer
from airflow_exactly_once.ui.app import report_json
from airflow_exactly_once.ui.loading import DriftResult, LagResult, LedgerReader, read_drift
from airflow_exactly_once.ui.page import pipeline_page
from devtools.airflow_stack import AirflowStack, metadata_server
from devtools.ledger_history import load_history
from devtools.postgres import LocalPostgres
from tests.harness import FakeSource, MarkerWriter, pipeline_config

PIPELINE = "orders"
RECORDS = 100  # offsets per partition per batch
SPACING = timedelta(minutes=1)  # between the history's batches (devtools/ledger_history.py)
COMMITTED_AFTER = timedelta(seconds=20)  # a history batch's updated_at after its planning: when its event was recorded
EVENT_CHUNK = 20_000  # events per COPY
SHOWN = 10  # rows `batches` prints: as many as the small ledger has, so both print the same
OPERATIONS = ("plan", "notify_complete", "cli batches", "ledger page", "page with drift")
EVENT_COLUMNS = ("asset_id", "extra", "source_task_id", "source_dag_id", "source_run_id", "source_map_index",
                 "timestamp")


class AirflowEvents:
    """Airflow's metadata database for one ledger: its own schema (`airflow db migrate`), the pipeline's Asset, and
    the Asset event notify_complete records for each committed batch."""

    def __init__(self, server: LocalPostgres, database: str, home: Path) -> None:
        url = server.create_database(database)
        AirflowStack(home, [], database_url=url).cli(["db", "migrate"])  # its schema only: no component starts
        self.engine = sa.create_engine(url)
        uri = pipeline_asset_uri(PIPELINE)
        with self.engine.begin() as conn:
            self.asset_id = conn.execute(sa.text(
                'INSERT INTO asset (name, uri, "group", extra, created_at, updated_at) '
                "VALUES (:uri, :uri, 'asset', '{}', now(), now()) RETURNING id"), {"uri": uri}).scalar_one()

    def load_history(self, batches: int, partitions: int, oldest: datetime) -> float:
        """The events of the history devtools/ledger_history.py loaded (same seqs, ranges and times); seconds taken.
        The page's drift check (asserted no drift) confirms they match the ledger."""
        started = time.perf_counter()
        with self.engine.begin() as conn:
            cursor = conn.connection.dbapi_connection.cursor()
            for first in range(1, batches + 1, EVENT_CHUNK):
                rows = io.StringIO()
                writer = csv.writer(rows)
                for seq in range(first, min(batches + 1, first + EVENT_CHUNK)):
                    batch = Batch(PIPELINE, seq, f"scheduled__{seq}", BatchState.COMMITTED, seq,
                                  tuple(OffsetRange(PIPELINE, p, (seq - 1) * RECORDS, seq * RECORDS)
                                        for p in range(partitions)),
                                  input_records=partitions * RECORDS, output_records=partitions * RECORDS)
                    writer.writerow(self._row(batch, oldest + SPACING * (seq - 1) + COMMITTED_AFTER))
                rows.seek(0)
                cursor.copy_expert(f"COPY asset_event ({', '.join(EVENT_COLUMNS)}) FROM STDIN WITH (FORMAT csv)", rows)
            cursor.close()
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE asset_event")  # statistics, as autovacuum keeps them
        return time.perf_counter() - started

    def record(self, batch: Batch) -> None:
        """The event a committed batch's notify_complete records."""
        with self.engine.begin() as conn:
            conn.execute(sa.text(f"INSERT INTO asset_event ({', '.join(EVENT_COLUMNS)}) VALUES "
                                 "(:a, :extra, :task, :dag, :run, :map_index, :at)"),
                         dict(zip(("a", "extra", "task", "dag", "run", "map_index", "at"),
                                  self._row(batch, datetime.now(timezone.utc)))))

    def _row(self, batch: Batch, at: datetime) -> tuple:
        return (self.asset_id, json.dumps(batch_event_extra(batch)), "notify_complete", f"{PIPELINE}_dag",
                batch.run_id, -1, at.isoformat())


class Subject:
    """One pipeline on one ledger, run batch after batch through the protocol, its Asset events in `events`."""

    def __init__(self, url: str, work: Path, history: int, partitions: int, keep_batches: int | None,
                 rounds: int, events: AirflowEvents) -> None:
        self.url = url
        self.work = work
        self.events = events
        self.config = self._config(keep_batches)
        self.ledger = Ledger(url)
        started = time.perf_counter()
        oldest = datetime.now(timezone.utc) - timedelta(hours=1) - SPACING * history
        positions = load_history(self.ledger, PIPELINE, self.config.to_stored_dict(),
                                 fingerprint=self.config.fingerprint(), batches=history, partitions=partitions,
                                 topic=PIPELINE, records=RECORDS, oldest=oldest, spacing=SPACING)
        self.load_s = time.perf_counter() - started
        self.events_load_s = events.load_history(history, partitions, oldest)
        self.ledger.record_dag(PIPELINE, f"{PIPELINE}_dag")  # as the plan task does: the page needs no run-id lookup
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
        """One batch: plan, write (not timed), notify_complete (and its Asset event, not timed); then the CLI's
        `batches` and the ledger page without and with its drift section."""
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
        self.events.record(self.ledger.get_batch(BatchId(PIPELINE, outcome.batch.seq)))
        timings["cli batches"] = timed(lambda: cli_quietly("--ledger-url", self.url, "batches", PIPELINE,
                                                           "--limit", str(SHOWN)))
        timings["ledger page"] = timed(lambda: ledger_page(self.url, None))
        timings["page with drift"] = timed(lambda: ledger_page(self.url, self.events, expect_no_drift=True))
        return timings


def cli_quietly(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli(list(argv))
    if code:
        raise RuntimeError(f"airflow-exactly-once {' '.join(argv)} exited {code}: {out.getvalue()[-500:]}")
    return out.getvalue()


def ledger_page(url: str, events: AirflowEvents | None, expect_no_drift: bool = False) -> None:
    """What GET /exactly-once/ui and /api/pipelines/<id> do with the ledger (a new reader per request), with the
    drift section when `events` is given (read in a session of its own, as the api-server opens one per request)."""
    reader = LedgerReader(url)
    now = datetime.now(timezone.utc)
    pipelines = reader.pipelines()
    report = reader.report(PIPELINE, now=now)
    lag = LagResult(partition_lags(report.committed, report.claimed, {}, {}), servers="(not asked)")
    drift = None
    if events is not None:
        with Session(events.engine) as session:
            drift = read_drift(reader, report, session)
        if drift.errors or drift.report is None or (expect_no_drift and not drift.report.ok):
            raise RuntimeError(f"the drift section did not compare cleanly: {drift.errors} "
                               f"{[f.describe() for f in drift.report.drift] if drift.report else ''}")
    report_json(report, lag, drift or DriftResult(None))
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


def run_backend(name: str, urls: Callable[[str], str], airflow: LocalPostgres, work: Path,
                args: argparse.Namespace) -> None:
    print(f"\n== {name}: {args.batches:,} historical batches x {args.partitions} partitions "
          f"(retention keeps {args.keep_batches:,}), one Asset event each ==", flush=True)

    def events(db: str) -> AirflowEvents:
        return AirflowEvents(airflow, f"airflow_{name.lower()}_{db}", work / f"airflow-home-{name}-{db}")

    big = Subject(urls("big"), work / f"{name}-big", args.batches, args.partitions, None, args.rounds, events("big"))
    small = Subject(urls("small"), work / f"{name}-small", args.small_batches, args.partitions, args.keep_batches,
                    args.rounds, events("small"))
    os.sync()  # the big load's writeback would otherwise slow the small ledger's commits (SQLite syncs each one)
    print(f"loaded: small in {small.load_s:.1f} s, big in {big.load_s:.1f} s; Airflow's Asset events: big in "
          f"{big.events_load_s:.1f} s", flush=True)
    reference = f"small ({args.small_batches} batches)"
    rows = {reference: measure(small, args.rounds),
            f"big ({args.batches:,} batches), retention off": measure(big, args.rounds)}
    # A new (or reset) ledger beside Airflow's long history: the page's window must not read every event.
    rows["small, beside the big one's Asset events"] = {"page with drift": statistics.median(
        timed(lambda: ledger_page(small.url, big.events)) for _ in range(args.rounds))}
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
                                       if op in figures else f"{'-':>24}" for op in OPERATIONS))
    for subject in (small, big):
        subject.ledger.engine.dispose()
        subject.events.engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=1_000_000,
                        help="historical batches of the big ledger (525600: a year of runs every minute)")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=15, help="measured batches per ledger (the median is shown)")
    parser.add_argument("--keep-batches", type=int, default=1000, help="retention_batches after the prune")
    parser.add_argument("--small-batches", type=int, default=10,
                        help="historical batches of the small ledger (60: the page shows as many rows as on the big)")
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    args = parser.parse_args()
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="aeo-bench-ledger-"))
    airflow = metadata_server(work / "airflow-pg")  # Airflow's metadata database, as the dev tooling runs it
    try:
        if args.backend in ("sqlite", "both"):
            run_backend("SQLite", lambda db: f"sqlite:///{work / (db + '.db')}", airflow, work, args)
        if args.backend in ("postgresql", "both"):
            server = LocalPostgres(work / "pg").start()
            try:
                run_backend("PostgreSQL", server.create_database, airflow, work, args)
            finally:
                server.stop()
    finally:
        airflow.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nload average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
