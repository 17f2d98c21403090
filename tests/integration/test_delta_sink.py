"""The Delta Lake sink on real Spark and real Delta tables: what only this sink has (the contract suite covers the
rest: invisible until commit, idempotent commit, abort, lost staged files, fenced attempts).

Spark stages Parquet in the table's folder and delta-rs commits; the tables are read back with Spark's own Delta
reader (a process of its own: tests.delta_spark_reader, whose session has Delta's extension and catalog) and with
delta-rs. Crashes are SIGKILLs of a real process at the protocol's named fault points (core.faults).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_exactly_once.airflow_integration.metrics import PipelineMetrics
from airflow_exactly_once.cli.main import main as cli
from airflow_exactly_once.observe.backlog import read_pipeline
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.faults import ENV as FAULTS_ENV
from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.model import Batch, BatchId, OffsetRange
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.sinks.delta.commits import RETENTION_PROPERTY, STAGING, WITHDRAWN, attempt_folder
from airflow_exactly_once.spark.partition_writers import run_partition_writers
from airflow_exactly_once.spark.write_job import run_write
from airflow_exactly_once.ui.loading import PipelineSummary, commit_deadline_ms
from airflow_exactly_once.ui.page import pipeline_page
from tests.delta_helpers import delta_rows, delta_staged, live_paths
from tests.delta_spark_reader import SparkDeltaReader
from tests.harness import REPO, FakeSource, Pipe, open_ledger, pipeline_config
from tests.integration.test_bad_records import BAD, GOOD, share, source  # noqa: F401 - source: the topic fixture
from tests.integration.test_bad_records import pipe as kafka_pipe
from tests.unit.test_metrics import FakeStats

SCHEMA = "key STRING, value STRING, part STRING"


@pytest.fixture(scope="module")
def reader():
    started = SparkDeltaReader()
    yield started
    started.stop()


def new_pipe(root: Path | str, ledger: Path, pipeline_id: str | None = None, **spec: Any) -> Pipe:
    sink = {"type": "delta", "path": str(root), "create_table": True, "partitioned_by": ["part"], **spec}
    config = pipeline_config(pipeline_id or f"delta-{uuid.uuid4().hex[:8]}", ["in"], sink)
    pipe = Pipe(config, open_ledger(ledger), lambda: FakeSource({("in", 0): 1000}),
                run_writers=run_partition_writers)
    pipe.sink.check(config.pipeline_id)
    return pipe


def rows_of(prefix: str, n: int = 9) -> list[tuple[str, str, str | None]]:
    """Rows over three partitions whose Hive folders need escaping ("a b", "x:y") and a null partition."""
    parts = ["a b", "x:y", None]
    return [(f"{prefix}-{i}", f"{prefix}-{i}", parts[i % 3]) for i in range(n)]


def planted(pipe: Pipe, start: int, n: int = 9) -> Batch:
    return pipe.planted_batch(f"run-{start}", [OffsetRange("in", 0, start, start + n)])


def publish(pipe: Pipe, spark: Any, prefix: str, start: int) -> tuple[Batch, list[str]]:
    """One batch through write and notify_complete."""
    rows = rows_of(prefix)
    prepared = pipe.write(planted(pipe, start).id, spark.createDataFrame(rows, SCHEMA).repartition(3))
    pipe.commit(prepared.id)
    return pipe.ledger.get_batch(prepared.id), [r[1] for r in rows]


def spark_values(reader: SparkDeltaReader, root: Path, version: int | None = None) -> list[str]:
    return sorted(r["value"] for r in reader.rows(root, version))


def test_each_batch_is_one_version_read_whole_by_spark_and_delta_rs_and_replaced_or_retracted_in_one_commit(
        spark, reader, tmp_path):
    root = tmp_path / "events"
    pipe = new_pipe(root, tmp_path / "ledger.db")
    prepared = pipe.write(planted(pipe, 0).id, spark.createDataFrame(rows_of("one"), SCHEMA).repartition(3))
    assert prepared.state is BatchState.PREPARED
    assert spark_values(reader, root) == [] and delta_rows(root) == []  # staged: no reader sees it
    pipe.commit(prepared.id)
    second, values = publish(pipe, spark, "two", 9)
    first_values = [r[1] for r in rows_of("one")]

    expected = sorted(first_values + values)
    assert spark_values(reader, root) == expected
    assert sorted(delta_rows(root, "value")) == expected
    assert sorted((r["value"], r["part"]) for r in delta_rows(root)) == sorted(
        (r[1], r[2]) for r in rows_of("one") + rows_of("two"))  # partition values, escaped folders and null
    assert reader.versions(root) == [[0, "CREATE TABLE"], [1, "WRITE"], [2, "WRITE"]]  # one version per batch
    assert spark_values(reader, root, version=1) == sorted(first_values)  # time travel: batch one alone
    assert sorted(delta_rows(root, "value", version=1)) == sorted(first_values)

    history = DeltaTable(str(root)).history(1)[0]
    assert (history["aeo.batch"], history["aeo.attempt"]) == (f"{pipe.config.pipeline_id}:{second.seq}",
                                                            str(second.epoch))
    actions = pa.table(DeltaTable(str(root)).get_add_actions(flatten=True)).to_pydict()
    assert sum(actions["num_records"]) == 18 and all(v is not None for v in actions["min.key"])  # footer stats
    assert all(p.startswith("_aeo_staging/") for p in live_paths(root))  # added where Spark staged them

    again = pipe.sink.commit(second, pipe.sink.committable(second.handles))  # a replay below the ledger
    assert "already published" in again and DeltaTable(str(root)).version() == 2
    assert delta_staged(root) == []

    # Replacing (interval_rerun="replace") and retracting are one commit each, on the same table.
    first = pipe.ledger.get_batch(prepared.id)
    rows = rows_of("new")
    claimed = pipe.claim(planted(pipe, 18).id)
    staged = pipe.stage(spark.createDataFrame(rows, SCHEMA), claimed)
    outcome = pipe.sink.commit_replacing(claimed, staged, replaced=first)
    assert "removing batch" in outcome and DeltaTable(str(root)).version() == 3  # one commit
    assert spark_values(reader, root) == sorted(values + [r[1] for r in rows])
    assert "already published" in pipe.sink.commit_replacing(claimed, staged, replaced=first)

    assert "withdrew" in pipe.sink.retract(second, pipe.sink.committable(second.handles))
    assert sorted(delta_rows(root, "value")) == sorted(r[1] for r in rows)
    assert "nothing" in pipe.sink.retract(second, None)  # idempotent
    assert sorted(delta_rows(root, "value", version=3)) == sorted(values + [r[1] for r in rows])

    # The withdrawn batches' files stay for time travel within the retention (a week: Delta's default), and go at a
    # later commit after it: here the table's retention is cut to a second.
    withdrawn = {attempt_folder(b.pipeline_id, b.seq, b.epoch) for b in (first, second)}
    assert all((root / f).is_dir() for f in withdrawn)
    DeltaTable(str(root)).alter.set_table_properties({RETENTION_PROPERTY: "interval 1 second"})
    time.sleep(1.1)
    _, later_values = publish(pipe, spark, "later", 27)
    assert not any((root / f).exists() for f in withdrawn)
    assert not list((root / STAGING / pipe.config.pipeline_id / WITHDRAWN).iterdir())  # their markers too
    assert sorted(delta_rows(root, "value")) == sorted([r[1] for r in rows] + later_values)  # live files stay


def test_another_writer_appending_between_stage_and_commit_does_not_break_the_commit(spark, reader, tmp_path):
    root = tmp_path / "shared"
    pipe = new_pipe(root, tmp_path / "ledger.db")
    prepared = pipe.write(planted(pipe, 0).id, spark.createDataFrame(rows_of("ours"), SCHEMA))
    appended = reader.ask(op="append", path=str(root), rows=[["theirs-0", "theirs-0", "z"]], schema=SCHEMA)
    assert appended == {"ok": True}  # Spark's own Delta writer, another process, committed version 1
    pipe.commit(prepared.id)
    assert spark_values(reader, root) == sorted([r[1] for r in rows_of("ours")] + ["theirs-0"])
    assert [v[1] for v in reader.versions(root)] == ["CREATE TABLE", "WRITE", "WRITE"]


def test_a_folder_that_is_not_a_delta_table_is_refused_at_plan_time(tmp_path):
    root = tmp_path / "plain"
    root.mkdir()
    (root / "data.parquet").write_bytes(b"PAR1")
    with pytest.raises(ConfigurationError, match="holds no Delta table"):
        new_pipe(root, tmp_path / "l1.db", create_table=False)
    with pytest.raises(ConfigurationError, match="not a Delta table .* and not empty"):
        new_pipe(root, tmp_path / "l2.db")


def test_an_output_that_does_not_match_the_table_is_refused_before_staging(spark, tmp_path):
    root = tmp_path / "typed"
    pipe = new_pipe(root, tmp_path / "ledger.db")
    publish(pipe, spark, "fine", 0)
    files = sorted((root / "_aeo_staging").rglob("*"))
    frame = spark.createDataFrame([("k", 1, "a")], "key STRING, value INT, part STRING")
    with pytest.raises(ConfigurationError, match="column value is integer in the output, string in the table"):
        pipe.write(planted(pipe, 9).id, frame)
    assert delta_staged(root) == [] and sorted((root / "_aeo_staging").rglob("*")) == files  # nothing staged


def test_spark_defaults_are_written_and_deletion_vectors_refused_at_plan_time(spark, reader, tmp_path):
    plain, vectors = tmp_path / "by_spark", tmp_path / "with_dv"
    reader.ask(op="sql", statement=f"CREATE TABLE delta.`{plain}` ({SCHEMA}) USING delta PARTITIONED BY (part)")
    reader.ask(op="sql", statement=f"CREATE TABLE delta.`{vectors}` ({SCHEMA}) USING delta "
                                   "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    pipe = new_pipe(plain, tmp_path / "l1.db", create_table=False)  # Spark's default protocol: writable
    _, values = publish(pipe, spark, "spark-made", 0)
    assert spark_values(reader, plain) == sorted(values)
    with pytest.raises(ConfigurationError, match="deletionVectors"):
        new_pipe(vectors, tmp_path / "l2.db", create_table=False)
    assert not (vectors / "_aeo_staging").exists()


# -- dead letters, and the operator's commands on a Delta pipeline ----------------------------------------------

def test_dead_letters_land_in_a_delta_table_of_their_own_and_the_cli_shows_and_rewinds_both(
        kafka, spark, reader, tmp_path, source, capsys):
    topic, sent = source
    root = tmp_path / "shares"
    dead = root / "_dead_letter"  # the default destination beside a Delta output
    p = kafka_pipe(kafka, tmp_path, topic, {"type": "delta", "path": str(root), "create_table": True},
                   bad_record_policy="dead_letter")
    batch_id = p.plan("run-1").batch.id
    summary = run_write(spark, p.coordinator, batch_id, transform=share)
    assert (summary["output_records"], summary["bad_records"]) == (GOOD, 4)
    assert delta_rows(root) == [] and delta_rows(dead) == []  # both staged, neither visible

    p.new_coordinator().commit(batch_id)  # notify_complete, another process
    versions = DeltaTable(str(root)).version(), DeltaTable(str(dead)).version()
    assert versions == (1, 1)  # created by the write, then one commit each
    batch = p.ledger.get_batch(batch_id)
    p.new_coordinator().commit(batch_id)  # notify_complete again
    assert "already published" in p.sink.commit(batch, p.sink.committable(batch.handles))  # below the ledger too
    assert (DeltaTable(str(root)).version(), DeltaTable(str(dead)).version()) == versions  # a replay adds nothing

    assert sorted(delta_rows(root, "id")) == list(range(GOOD))
    letters = delta_rows(dead)
    assert {(d["source_partition"], d["source_offset"]): d["value"] for d in letters} == {
        where: value for where, value in sent.items() if value in BAD}
    assert {d["source_topic"] for d in letters} == {topic} and all(d["error"] for d in letters)
    assert sorted(r["source_offset"] for r in reader.rows(dead)) == sorted(d["source_offset"] for d in letters)
    assert delta_staged(root) == [] and delta_staged(dead) == []

    # The operator's CLI on the ledger holding the Delta batch, as on any other sink's.
    url = str(p.ledger.engine.url)
    pid = p.config.pipeline_id
    assert cli(["--ledger-url", url, "--json", "batches", pid]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["state"], row["in"], row["out"], row["bad"]) == ("COMMITTED", str(GOOD + 4), str(GOOD), "4")
    assert cli(["--ledger-url", url, "show", str(batch_id)]) == 0
    shown = capsys.readouterr().out
    assert f"batch {batch_id}  COMMITTED" in shown and "_aeo_staging/" in shown and '"dead_letter"' in shown
    assert cli(["--ledger-url", url, "check", pid, "--without", "asset-events", "--without", "consumer-group"]) == 0
    assert "tiling OK" in capsys.readouterr().out
    stats = FakeStats()  # the metrics notify_complete sends for it
    PipelineMetrics(pid, stats=stats).committed(batch)
    assert (stats.value("exactly_once.records_written", pipeline_id=pid),
            stats.value("exactly_once.records_bad", pipeline_id=pid, policy="dead_letter")) == (GOOD, 4)
    stored = p.ledger.stored_config(pid)
    assert commit_deadline_ms(stored) is None  # staged files wait for the commit or the abort
    page = pipeline_page(ledger=url, now=datetime.now(timezone.utc), base="/exactly-once/ui", lag=None,
                         pipelines=[PipelineSummary(pid, 1, {}, None)], report=read_pipeline(p.ledger, pid))
    assert f'data-seq="{batch_id.seq}" data-state="COMMITTED" data-in="{GOOD + 4}" data-out="{GOOD}"' in page
    assert f"{topic} &rarr; delta" in page  # the sink, as the page names every sink
    assert cli(["--ledger-url", url, "rewind", pid, "--to-offsets", f"{topic}:0=0", f"{topic}:1=0",
                "--bootstrap-servers", kafka.bootstrap_servers, "--execute"]) == 0
    assert "withdrew batch" in capsys.readouterr().out
    assert delta_rows(root) == [] and delta_rows(dead) == []  # both withdrawn, one commit each
    assert sorted(delta_rows(root, "id", version=1)) == list(range(GOOD))  # time travel still reads the batch
    assert p.state(batch_id) is BatchState.RETRACTED


# -- crashes: a real process killed at each fault point of the protocol -----------------------------------------

def step_in_process(request: dict[str, Any]) -> None:
    """The crashing process (python -m tests.integration.test_delta_sink '<json>'): notify_complete of one batch, as
    the task runs it, with the fault points armed through the environment."""
    pipe = new_pipe(Path(request["root"]), Path(request["ledger"]), request["pipeline_id"])
    pipe.commit(BatchId.parse(request["batch_id"]))


def killed(request: dict[str, Any], faults: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "tests.integration.test_delta_sink", json.dumps(request)],
                            cwd=REPO, env={**os.environ, FAULTS_ENV: str(faults), "PYTHONPATH": str(REPO)},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == -9, f"the process was not killed at its fault point: {result.stderr[-2000:]}"


# The write's crash points are not run here: killed before staging, a write leaves nothing of the sink (the retry's
# claim is the protocol's, tests/unit/test_protocol.py); killed after staging, it leaves an attempt folder never
# prepared, which is the contract suite's fenced attempt (test_sink_contract.py, "delta" and "delta:s3": never
# visible, removed by the commit).
@pytest.mark.parametrize("point", ["notify.before_sink_commit", "notify.after_sink_commit"])
def test_a_process_killed_at_each_protocol_step_ends_exact(spark, tmp_path, point):
    root, ledger, faults = tmp_path / "crash", tmp_path / "ledger.db", tmp_path / "faults"
    pipe = new_pipe(root, ledger)
    first, first_values = publish(pipe, spark, "before", 0)
    rows = rows_of("crash")
    batch = planted(pipe, 9)
    request = {"root": str(root), "ledger": str(ledger), "pipeline_id": pipe.config.pipeline_id,
               "batch_id": str(batch.id)}
    pipe.write(batch.id, spark.createDataFrame(rows, SCHEMA))
    arm(faults, point, "kill")
    killed(request, faults)

    retry = new_pipe(root, ledger, pipe.config.pipeline_id)  # the retried task, in a new process's state
    retry.commit(batch.id)
    expected = sorted(first_values + [r[1] for r in rows])
    assert sorted(delta_rows(root, "value")) == expected
    assert DeltaTable(str(root)).version() == 2  # created, the first batch, this batch: once
    assert delta_staged(root) == []  # nothing staged is left


if __name__ == "__main__":
    step_in_process(json.loads(sys.argv[1]))
