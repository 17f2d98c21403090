"""Make the checked-in ledger fixtures: a ledger as a release writes it, on SQLite and on PostgreSQL.

The upgrade test (tests/integration/test_ledger_upgrade.py) loads them, lets the code of today
migrate them and runs the next batches. Run this with the code of the release the fixture stands
for, e.g. the last release before a schema change:

    git worktree add /tmp/release v0.1.0
    PYTHONPATH=/tmp/release python devtools/ledger_fixtures.py tests/fixtures/ledger/0.1.0

(run as a script, so that `airflow_exactly_once`, `tests.harness` and `devtools.postgres` are the
release's). It writes `sqlite.sql` (the SQLite file's dump), `postgresql.sql` (pg_dump --inserts of
the same scenario), `output/` (the Parquet marker sink's folder: the committed batches and the
PREPARED batch's staged files) and `scenario.json` (what the ledger holds). The sink path is
written as OUTPUT_PLACEHOLDER, which the test replaces with its own folder.

The scenario (pipeline `orders`, topic `orders` with 2 partitions of 30 and 23 offsets, 5 per batch):
batch 1 COMMITTED with 2 bad records skipped (details and a bad-records-skipped event), batch 2
COMMITTED, batch 3 ABORTED (its range is planned again), batch 4 PREPARED (notify_complete never ran).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: import the release's code from PYTHONPATH, not this checkout
    sys.path.remove(str(Path(__file__).resolve().parent))

OUTPUT_PLACEHOLDER = "@AEO_FIXTURE_OUTPUT@"
PIPELINE = "orders"
TOPIC = "orders"
ENDS = {(TOPIC, 0): 30, (TOPIC, 1): 23}
PER_BATCH = 5
BAD_RECORDS = {"count": 2, "policy": "skip", "first": [{"topic": TOPIC, "partition": 0, "offset": 3}]}


def scenario_config(output: Path) -> Any:
    """The pipeline's configuration (the upgrade test plans its next batches with the same one)."""
    from tests.harness import pipeline_config

    return pipeline_config(PIPELINE, [TOPIC], {"type": "parquet", "path": str(output)},
                           max_records_per_partition=PER_BATCH, bad_record_policy="skip")


def write_scenario(url: str, output: Path) -> dict[str, Any]:
    """Run the scenario's batches through the protocol core on the ledger at `url`; return what it holds."""
    from airflow_exactly_once.core.ledger import Ledger
    from tests.harness import FakeSource, MarkerWriter, Pipe

    ledger = Ledger(url)
    source = FakeSource(dict(ENDS))
    pipe = Pipe(scenario_config(output), ledger, lambda: source, writer_factory=MarkerWriter.of)
    first = pipe.plan("run-1").batch
    claimed = pipe.claim(first.id)
    pipe.coordinator.prepare(claimed, pipe.stage(None, claimed), first.offset_span, first.offset_span - 2,
                             details={"bad_records": BAD_RECORDS})
    pipe.commit(first.id)
    ledger.record_dag(PIPELINE, "orders_dag")
    second = pipe.plan("run-2").batch
    pipe.write(second.id)
    pipe.commit(second.id)
    third = pipe.plan("run-3").batch
    pipe.abort(third.id, "the write task failed (fixture)")
    fourth = pipe.plan("run-4").batch
    pipe.write(fourth.id)  # notify_complete never ran: PREPARED
    scenario = {"pipeline": PIPELINE, "ends": {f"{t}:{p}": end for (t, p), end in ENDS.items()},
                "per_batch": PER_BATCH, **ledger_facts(ledger)}
    ledger.engine.dispose()
    return scenario


def ledger_facts(ledger: Any, *, positions: bool = True) -> dict[str, Any]:
    """What the ledger holds about the scenario's pipeline: batch states and ranges, positions, events, bad records.

    `positions=False` leaves committed positions out: today's code reads them with the retention floor of
    revision 0002, so only once the ledger is upgraded."""
    batches = ledger.list_batches(PIPELINE, newest_first=False)
    facts = {
        "states": {str(b.seq): b.state.value for b in batches},
        "ranges": {str(b.seq): [[r.topic, r.partition, r.start, r.end] for r in b.ranges] for b in batches},
        "events": [e["kind"] for e in reversed(ledger.list_events(PIPELINE, limit=1000))],
        "bad_records": {str(b.seq): b.details["bad_records"]["count"] for b in batches
                        if b.details.get("bad_records")},
    }
    if positions:
        facts["committed_positions"] = {f"{t}:{p}": offset
                                        for (t, p), offset in sorted(ledger.committed_positions(PIPELINE).items())}
    return facts


def _placeholder(text: str, output: Path) -> str:
    return text.replace(str(output), OUTPUT_PLACEHOLDER)


def sqlite_fixture(work: Path, output: Path) -> tuple[str, dict[str, Any]]:
    path = work / "ledger.db"
    scenario = write_scenario(f"sqlite:///{path}", output)
    with sqlite3.connect(path) as conn:
        return _placeholder("\n".join(conn.iterdump()) + "\n", output), scenario


def postgresql_fixture(work: Path, output: Path) -> tuple[str, dict[str, Any]]:
    from devtools.postgres import LocalPostgres

    server = LocalPostgres(Path(tempfile.mkdtemp(prefix="aeo-fixture-pg-")))
    server.start()
    try:
        scenario = write_scenario(server.create_database("ledger"), output)
        dump = subprocess.run([server._client("pg_dump"), "--inserts", "--no-owner", "--no-privileges",
                               "-d", server.dsn("ledger")], check=True, capture_output=True, text=True,
                              env=server._client_env()).stdout
    finally:
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)
    # Only what any PostgreSQL >= 12 and its psql load: no comments, no psql meta-commands of newer pg_dumps.
    lines = [line for line in dump.splitlines()
             if not line.startswith(("--", "\\restrict", "\\unrestrict", "SET transaction_timeout"))]
    return _placeholder(re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n", output), scenario


def generate(target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="aeo-fixture-") as tmp:
        work = Path(tmp)
        scenarios = {}
        for name, make in (("sqlite", sqlite_fixture), ("postgresql", postgresql_fixture)):
            output = work / f"{name}-output"  # the same scenario twice: the two sink folders are identical
            dump, scenarios[name] = make(work, output)
            (target / f"{name}.sql").write_text(dump)
        if scenarios["sqlite"] != scenarios["postgresql"]:
            raise RuntimeError(f"the two backends recorded different ledgers: {scenarios}")
        shutil.rmtree(target / "output", ignore_errors=True)
        shutil.copytree(work / "sqlite-output", target / "output")
    (target / "scenario.json").write_text(json.dumps(scenarios["sqlite"], indent=1, sort_keys=True) + "\n")
    print(f"wrote {', '.join(sorted(p.name for p in target.iterdir()))} to {target}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path, help="the fixture folder, e.g. tests/fixtures/ledger/0.1.0")
    generate(parser.parse_args(argv).target.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
