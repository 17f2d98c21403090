"""The offset ledger behaves the same on SQLite and on PostgreSQL (real server, real sessions).

Every test runs on both backends. The fencing tests race real concurrent sessions (threads
with their own connections, and separate processes) on the same rows: the database, not
timing, decides who wins.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from airflow_exactly_once.core.errors import FencedError, IllegalTransitionError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.ledger import engine as engine_module
from airflow_exactly_once.core.model import BatchId, OffsetRange
from airflow_exactly_once.core.states import BatchState
from tests.harness import FakeSource, MarkerWriter, Pipe, pipeline_config

RACERS = 8
LEDGER_DB = "ledger_tests"


@pytest.fixture(scope="module")
def pg_ledger_url(postgres) -> str:
    return postgres.create_database(LEDGER_DB)


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return request.getfixturevalue("pg_ledger_url")


@pytest.fixture
def ledger(ledger_url) -> Ledger:
    ledger = Ledger(ledger_url)
    ledger.create_schema()
    yield ledger
    ledger.engine.dispose()


@pytest.fixture
def pid() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


def ranges(start: int, end: int) -> list[OffsetRange]:
    return [OffsetRange("t", 0, start, end), OffsetRange("t", 1, start, end)]


def race(n: int, fn) -> list:
    """Run fn(i) in n threads released at the same instant; returns results or exceptions."""
    barrier = threading.Barrier(n)

    def run(i):
        barrier.wait()
        try:
            return fn(i)
        except Exception as exc:  # the outcome under test
            return exc

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


# -- same behaviour on both backends -------------------------------------------------


def test_batch_lifecycle_and_positions(ledger, pid):
    assert ledger.ensure_pipeline(pid, "fp1", {"a": 1}) == 0
    ledger.register_partitions(pid, {("t", 0): (5, "earliest"), ("t", 1): (5, "earliest")})
    ledger.register_partitions(pid, {("t", 0): (99, "latest")})  # known partitions keep their start
    assert ledger.committed_positions(pid) == {("t", 0): 5, ("t", 1): 5}

    batch = ledger.create_batch(pid, "run-1", ranges(5, 15), expected_epoch=0)
    assert (batch.seq, batch.state, batch.epoch, batch.offset_span) == (1, BatchState.PLANNED, 1, 20)
    claimed = ledger.claim(batch.id)
    assert claimed.epoch == 2 and ledger.pipeline(pid)["epoch"] == 2
    prepared = ledger.mark_prepared(batch.id, claimed.epoch, {"gids": ["g1"], "n": 3}, 20, 18)
    assert prepared.state is BatchState.PREPARED and prepared.handles == {"gids": ["g1"], "n": 3}
    assert ledger.committed_positions(pid) == {("t", 0): 5, ("t", 1): 5}  # not before COMMITTED
    assert ledger.mark_committed(batch.id) is True
    assert ledger.mark_committed(batch.id) is False  # idempotent
    assert ledger.committed_positions(pid) == {("t", 0): 15, ("t", 1): 15}

    second = ledger.create_batch(pid, "run-2", ranges(15, 20), expected_epoch=2)
    assert second.seq == 2
    assert ledger.mark_aborted(second.id, "write failed") is True
    assert ledger.mark_aborted(second.id, "again") is False
    assert ledger.get_batch(second.id).error == "write failed"
    assert ledger.committed_positions(pid) == {("t", 0): 15, ("t", 1): 15}
    assert [b.seq for b in ledger.list_batches(pid)] == [2, 1]
    assert [b.seq for b in ledger.list_batches(pid, [BatchState.COMMITTED])] == [1]
    assert ledger.latest_batch_for_run(pid, "run-2").state is BatchState.ABORTED
    kinds = [e["kind"] for e in ledger.list_events(pid)]
    assert kinds.count("partition-added") == 2 and "aborted" in kinds
    assert ledger.get_batch(batch.id).created_at is not None


def statements_on(ledger: Ledger) -> list[tuple[str, object]]:
    """Every statement the ledger's engine sends from now on, with its parameters (a batch of rows counts once)."""
    sent: list[tuple[str, object]] = []
    sa.event.listen(ledger.engine, "before_cursor_execute",
                    lambda _conn, _cursor, statement, parameters, *_: sent.append((statement, parameters)))
    return sent


def commit(ledger: Ledger, pid: str, seq_ranges: list[OffsetRange], epoch: int) -> int:
    """Plan, claim, prepare and commit one batch of `seq_ranges`; return the pipeline's epoch after it."""
    batch = ledger.create_batch(pid, f"run-{uuid.uuid4().hex[:6]}", seq_ranges, expected_epoch=epoch)
    claimed = ledger.claim(batch.id)
    ledger.mark_prepared(batch.id, claimed.epoch, {}, 1, 1)
    ledger.mark_committed(batch.id)
    return claimed.epoch


def test_the_batches_that_writes_return_are_the_batches_the_ledger_reads(ledger, pid):
    """create_batch, claim and mark_prepared return the row their statement wrote (RETURNING), not a read after
    it: with the database's own types (timestamps with their zone on PostgreSQL, without on SQLite)."""
    ledger.ensure_pipeline(pid, "fp", {})
    planned = ledger.create_batch(pid, "run-1", ranges(0, 10), expected_epoch=0, details={"a": 1})
    assert planned == ledger.get_batch(planned.id)
    claimed = ledger.claim(planned.id)
    assert claimed == ledger.get_batch(planned.id)
    prepared = ledger.mark_prepared(planned.id, claimed.epoch, {"h": 1}, 2, 3)
    assert prepared == ledger.get_batch(planned.id) and prepared.ranges == tuple(ranges(0, 10))
    other = ledger.create_batch(pid, "run-2", ranges(10, 20), expected_epoch=prepared.epoch)
    claimed = ledger.claim(other.id)
    prepared = ledger.mark_prepared(other.id, claimed.epoch, {}, 1, 1, details={"b": 2})
    assert prepared == ledger.get_batch(other.id) and prepared.details == {"b": 2}


def test_a_thousand_partitions_register_in_a_few_statements(ledger, pid):
    ledger.ensure_pipeline(pid, "fp", {})
    ledger.register_partitions(pid, {("t", 0): (7, "startup mode earliest")})
    sent = statements_on(ledger)
    ledger.register_partitions(pid, {("t", p): (p, "startup mode earliest") for p in range(1000)})
    assert len(sent) <= 10, f"{len(sent)} statements to register 1,000 partitions (one per row is too many)"
    starts = ledger.initial_offsets(pid)
    assert len(starts) == 1000 and starts[("t", 0)] == 7 and starts[("t", 999)] == 999  # known ones keep theirs
    added = [e["message"] for e in ledger.list_events(pid, limit=2000) if e["kind"] == "partition-added"]
    assert len(added) == 1000 and "t[999] starts at offset 999 (startup mode earliest)" in added


def test_positions_of_many_partitions_read_the_newest_batch_only(ledger, pid):
    wide = 300
    ledger.ensure_pipeline(pid, "fp", {})
    ledger.register_partitions(pid, {("t", p): (0, "startup mode earliest") for p in range(wide)})
    epoch = 0
    for n in range(40):  # more than one page of committed batches (rows._NEWEST_PAGE)
        epoch = commit(ledger, pid, [OffsetRange("t", p, n * 10, n * 10 + 10) for p in range(wide)], epoch)
    sent = statements_on(ledger)
    assert ledger.committed_positions(pid) == {("t", p): 400 for p in range(wide)}
    offset_reads = [params for statement, params in sent if "aeo_batch_offset" in statement]
    # One statement reads the page of newest committed batches with their ranges; the newest batch covers every
    # partition, so that page is the first one, of one batch (LIMIT 1), and no second page is read.
    assert len(offset_reads) == 1
    values = list(offset_reads[0].values() if isinstance(offset_reads[0], dict) else offset_reads[0])
    assert values.count(1) == 1 and 4 not in values, values


def test_a_partition_last_covered_long_ago_keeps_its_position(ledger, pid):
    """Pages of committed batches grow from the newest one; a partition only an old batch covers is still found."""
    ledger.ensure_pipeline(pid, "fp", {})
    ledger.register_partitions(pid, {("t", 0): (0, "earliest"), ("t", 1): (0, "earliest")})
    epoch = commit(ledger, pid, [OffsetRange("t", 0, 0, 5), OffsetRange("t", 1, 0, 3)], 0)
    for n in range(70):  # past 1 + 4 + 16 + 32 batches: several pages
        epoch = commit(ledger, pid, [OffsetRange("t", 0, 5 + n, 6 + n)], epoch)
    assert ledger.committed_positions(pid) == {("t", 0): 75, ("t", 1): 3}


def counted_pings(ledger: Ledger) -> list[int]:
    """The pings the ledger's pool sends from now on (one entry each)."""
    pings: list[int] = []
    ping = ledger.engine.dialect.do_ping

    def counting(dbapi_conn):
        pings.append(1)
        return ping(dbapi_conn)

    ledger.engine.dialect.do_ping = counting
    return pings


def test_a_busy_ledger_connection_is_reused_without_a_ping_and_an_idle_dropped_one_replaced(pg_ledger_url, pid):
    """PostgreSQL: a plan checks a connection out a dozen times in milliseconds; only one idle for a while is
    tested (core.ledger.engine._ping_when_idle), and one the server closed meanwhile is replaced, not failed on."""
    ledger = Ledger(pg_ledger_url)
    try:
        ledger.ensure_pipeline(pid, "fp", {})
        pings = counted_pings(ledger)
        for _ in range(5):
            assert ledger.pipeline(pid)["epoch"] == 0
        assert pings == []
        with ledger.engine.connect() as conn:
            backend = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        with Ledger(pg_ledger_url).engine.connect() as other:  # what a server restart or an idle timeout does
            assert other.exec_driver_sql(f"SELECT pg_terminate_backend({backend})").scalar() is True
        time.sleep(engine_module.PING_AFTER_IDLE_S + 0.2)
        assert ledger.pipeline(pid)["epoch"] == 0
        assert pings == [1]
        with ledger.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar() != backend
    finally:
        ledger.engine.dispose()


def test_a_ledger_at_head_is_checked_in_one_statement(ledger, ledger_url):
    """Every task opens its own engine and checks the schema first: one read of the version row, not the catalog."""
    for check in ("create_schema", "has_schema"):
        fresh = Ledger(ledger_url)
        try:
            sent = statements_on(fresh)
            getattr(fresh, check)()
            queries = [statement for statement, _ in sent if statement != "BEGIN IMMEDIATE"]  # SQLite's lock
            assert queries == ["SELECT version_num FROM aeo_alembic_version"]
        finally:
            fresh.engine.dispose()


def test_config_change_is_recorded(ledger, pid):
    ledger.ensure_pipeline(pid, "fp1", {"sink": "a"})
    assert ledger.ensure_pipeline(pid, "fp2", {"sink": "b"}) == 0
    assert ledger.pipeline(pid)["config"] == {"sink": "b"}
    assert ledger.list_events(pid)[0]["kind"] == "config-changed"


def test_stale_writer_and_illegal_transitions_are_refused(ledger, pid):
    ledger.ensure_pipeline(pid, "fp", {})
    batch = ledger.create_batch(pid, "run-1", ranges(0, 10), expected_epoch=0)
    first = ledger.claim(batch.id)
    second = ledger.claim(batch.id)  # a retry takes the batch over
    with pytest.raises(FencedError, match="held by epoch"):
        ledger.mark_prepared(batch.id, first.epoch, {}, 1, 1)
    with pytest.raises(FencedError):
        ledger.mark_committed(batch.id)  # PLANNED cannot be committed
    ledger.mark_prepared(batch.id, second.epoch, {}, 1, 1)
    with pytest.raises(FencedError, match="is PREPARED, not PLANNED"):
        ledger.claim(batch.id)
    with pytest.raises(FencedError):
        ledger.mark_aborted(batch.id, "late abort")  # only from PLANNED unless the sink lost it
    assert ledger.get_batch(batch.id).state is BatchState.PREPARED
    with pytest.raises(IllegalTransitionError):
        ledger.get_batch(BatchId(pid, 99))


def test_superseded_batch_cannot_become_prepared(ledger, pid):
    ledger.ensure_pipeline(pid, "fp", {})
    old = ledger.create_batch(pid, "run-a", ranges(0, 10), expected_epoch=0)
    writer = ledger.claim(old.id)
    new = ledger.create_batch(pid, "run-b", ranges(0, 10), expected_epoch=writer.epoch, supersede=[old.seq])
    assert ledger.get_batch(old.id).state is BatchState.ABORTED
    assert "superseded by run run-b" in ledger.get_batch(old.id).error
    with pytest.raises(FencedError):
        ledger.mark_prepared(old.id, writer.epoch, {}, 1, 1)
    assert ledger.get_batch(new.id).state is BatchState.PLANNED


# -- fencing with real concurrent sessions --------------------------------------------


def test_concurrent_first_use_of_a_fresh_ledger(request, tmp_path):
    """Tasks of several pipelines creating the tables of an empty ledger at the same instant."""
    for backend in ("sqlite", "postgres"):
        if backend == "sqlite":
            url = f"sqlite:///{tmp_path / 'fresh.db'}"
        else:
            url = request.getfixturevalue("postgres").create_database(f"fresh_{uuid.uuid4().hex[:8]}")
        ledgers = [Ledger(url) for _ in range(RACERS)]
        try:
            results = race(RACERS, lambda i: ledgers[i].ensure_pipeline(f"p{i}", "fp", {}))
        finally:
            for ledger in ledgers:
                ledger.engine.dispose()
        assert results == [0] * RACERS, (backend, results)


def test_concurrent_first_use_of_a_pipeline(ledger_url, pid):
    """Many tasks starting a new pipeline at once (each with its own engine) all see epoch 0."""
    engines = [Ledger(ledger_url) for _ in range(RACERS)]
    try:
        results = race(RACERS, lambda i: engines[i].ensure_pipeline(pid, "fp", {"n": 1}))
    finally:
        for e in engines:
            e.engine.dispose()
    assert results == [0] * RACERS, results


def test_concurrent_plans_only_one_takes_the_pipeline(ledger, pid):
    ledger.ensure_pipeline(pid, "fp", {})
    results = race(RACERS, lambda i: ledger.create_batch(pid, f"run-{i}", ranges(0, 10), expected_epoch=0))
    winners = [r for r in results if not isinstance(r, Exception)]
    losers = [r for r in results if isinstance(r, Exception)]
    assert len(winners) == 1, results
    assert all(isinstance(e, FencedError) and e.retriable for e in losers), losers
    assert [b.seq for b in ledger.list_batches(pid)] == [1]
    assert ledger.pipeline(pid)["epoch"] == 1


def test_concurrent_claims_and_prepares_only_the_last_claim_commits(ledger, pid):
    ledger.ensure_pipeline(pid, "fp", {})
    batch = ledger.create_batch(pid, "run-1", ranges(0, 10), expected_epoch=0)
    claims = race(RACERS, lambda i: ledger.claim(batch.id))
    held = [c.epoch for c in claims if not isinstance(c, Exception)]
    assert held and len(held) == len(set(held)), claims  # every successful claim has its own epoch
    assert all(isinstance(c, FencedError) for c in claims if isinstance(c, Exception))
    assert ledger.get_batch(batch.id).epoch == max(held)

    attempts = race(len(held), lambda i: ledger.mark_prepared(batch.id, held[i], {"epoch": held[i]}, 1, 1))
    done = [a for a in attempts if not isinstance(a, Exception)]
    assert len(done) == 1 and done[0].epoch == max(held), attempts
    assert all(isinstance(a, FencedError) for a in attempts if isinstance(a, Exception))
    assert ledger.get_batch(batch.id).handles == {"epoch": max(held)}


def _plan_in_process(url: str, pid: str, run: str, start, queue) -> None:
    ledger = Ledger(url)
    start.wait()
    try:
        batch = ledger.create_batch(pid, run, ranges(0, 10), expected_epoch=0)
        queue.put(("won", batch.seq))
    except FencedError as exc:
        queue.put(("fenced", str(exc)))


def test_concurrent_plans_from_separate_processes(ledger, ledger_url, pid):
    ledger.ensure_pipeline(pid, "fp", {})
    ctx = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    start, queue = ctx.Event(), ctx.Queue()
    ledger.engine.dispose()  # no pooled connection may cross a fork
    procs = [ctx.Process(target=_plan_in_process, args=(ledger_url, pid, f"run-{i}", start, queue))
             for i in range(4)]
    for p in procs:
        p.start()
    start.set()
    outcomes = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert sorted(o[0] for o in outcomes) == ["fenced", "fenced", "fenced", "won"], outcomes
    assert len(ledger.list_batches(pid)) == 1


# -- through an Airflow `postgres` connection -----------------------------------------


def test_ledger_hook_reads_an_airflow_postgres_connection(postgres, pg_ledger_url, monkeypatch, pid):
    from airflow_exactly_once.hooks.ledger import LedgerHook

    monkeypatch.setenv("AIRFLOW_CONN_EO_LEDGER_PG", json.dumps({
        "conn_type": "postgres", "host": "127.0.0.1", "port": postgres.port, "login": "postgres",
        "schema": LEDGER_DB, "extra": {"application_name": "eo ledger", "connect_timeout": 5}}))
    hook = LedgerHook(ledger_conn_id="eo_ledger_pg")
    url = hook.get_url()
    assert url == (f"postgresql+psycopg2://postgres@127.0.0.1:{postgres.port}/{LEDGER_DB}"
                   "?connect_timeout=5&application_name=eo%20ledger")
    ledger = hook.get_conn()
    ledger.ensure_pipeline(pid, "fp", {})
    ledger.create_batch(pid, "run-1", ranges(0, 3), expected_epoch=0)
    # The same rows, seen through a plain URL: one ledger, wherever it is reached from.
    assert [b.run_id for b in Ledger(pg_ledger_url).list_batches(pid)] == ["run-1"]
    with ledger.engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW application_name").scalar() == "eo ledger"


def test_a_run_whose_write_finishes_while_another_plans_is_recovered_not_failed(ledger_url, pid, tmp_path,
                                                                                 monkeypatch):
    """The interleaving of issue 12: B reads the epoch and the in-flight batches, A's write marks A's batch
    PREPARED, B records its batch superseding A's (no longer PLANNED). B must plan again (recovering A's
    batch first) instead of failing for good. Each run has its own ledger connection, as two tasks do."""
    config = pipeline_config(pid, ["t"], {"type": "parquet", "path": str(tmp_path / "out")})
    source = FakeSource({("t", 0): 10, ("t", 1): 10})
    run_a = Pipe(config, Ledger(ledger_url), lambda: source, writer_factory=MarkerWriter.of)
    run_b = Pipe(config, Ledger(ledger_url), lambda: source, writer_factory=MarkerWriter.of)
    a = run_a.plan("a").batch
    claimed = run_a.claim(a.id)
    staged = run_a.stage(None, claimed)
    real_create, forced = run_b.ledger.create_batch, []

    def a_prepares_first(*args, **kwargs):
        if not forced:
            forced.append(run_a.coordinator.prepare(claimed, staged, 20, 20))
        return real_create(*args, **kwargs)

    monkeypatch.setattr(run_b.ledger, "create_batch", a_prepares_first)
    outcome = run_b.plan("b")
    assert forced and forced[0].state is BatchState.PREPARED
    assert run_b.state(a.id) is BatchState.COMMITTED  # recovery first, by B
    assert outcome.action == "empty"  # A's batch took every offset there was; B found nothing new
    assert run_b.ledger.committed_positions(pid) == {("t", 0): 10, ("t", 1): 10}
    for pipe in (run_a, run_b):
        pipe.ledger.engine.dispose()


def _pipes(ledger_url: str, pid: str, tmp_path) -> tuple[Pipe, Pipe, FakeSource]:
    """Two tasks of one pipeline, each with its own ledger connection, over one fake source."""
    config = pipeline_config(pid, ["t"], {"type": "parquet", "path": str(tmp_path / "out")},
                             max_records_per_partition=5)
    source = FakeSource({("t", 0): 10, ("t", 1): 10})
    return (Pipe(config, Ledger(ledger_url), lambda: source, writer_factory=MarkerWriter.of),
            Pipe(config, Ledger(ledger_url), lambda: source, writer_factory=MarkerWriter.of), source)


def test_a_run_that_plans_after_the_first_epoch_read_makes_the_plan_plan_again(ledger_url, pid, tmp_path):
    """A plan's first attempt expects the epoch its first read of the pipeline row found (Planner._epoch), not
    one read later. Run A plans while run B's first attempt asks Kafka (after B read the epoch, its own batch and
    the batches in flight): B's record must fail its compare-and-set and B plan again, superseding A's batch,
    not record a second batch of the same range beside it."""
    run_a, run_b, source = _pipes(ledger_url, pid, tmp_path)
    raced: list = []

    def a_plans_meanwhile():
        if not raced:
            raced.append(run_a.plan("a").batch)
        return source

    run_b.source_factory = a_plans_meanwhile
    outcome = run_b.plan("b")
    a = raced[0]
    assert outcome.action == "planned" and outcome.superseded == (a.seq,)
    assert run_b.state(a.id) is BatchState.ABORTED and outcome.batch.ranges == a.ranges
    assert [b.seq for b in run_b.ledger.list_batches(pid, [BatchState.PLANNED])] == [outcome.batch.seq]
    for pipe in (run_a, run_b):
        pipe.ledger.engine.dispose()


def test_a_batch_of_the_same_run_recorded_after_its_first_read_is_replayed_on_the_next_attempt(ledger_url, pid,
                                                                                                tmp_path):
    """A plan's first attempt takes the run's own batch as _settled read it (none). Another attempt of the same
    run (a zombie task) records a batch and has it aborted while this attempt asks Kafka: the compare-and-set
    fails, and the next attempt reads the run's batch again and replays exactly its range ("replanned"),
    rather than planning the run anew."""
    zombie, run_b, source = _pipes(ledger_url, pid, tmp_path)
    raced: list = []

    def zombie_plans_and_aborts():
        if not raced:
            raced.append(zombie.plan("b").batch)
            zombie.abort(raced[0].id)
            source.ends[("t", 0)] = 100  # a new plan would now read further; a replay must not
        return source

    run_b.source_factory = zombie_plans_and_aborts
    outcome = run_b.plan("b")
    old = raced[0]
    assert outcome.action == "replanned" and outcome.batch.ranges == old.ranges
    assert outcome.batch.details == {"replays": old.seq}
    for pipe in (zombie, run_b):
        pipe.ledger.engine.dispose()


def test_ledger_hook_reads_an_exactly_once_ledger_connection(postgres, pg_ledger_url, monkeypatch, pid):
    """The provider's own connection type, filled in with the usual fields (backend postgresql by default)."""
    from airflow_exactly_once.hooks.ledger import LedgerHook

    monkeypatch.setenv("AIRFLOW_CONN_EO_LEDGER_OWN", json.dumps({
        "conn_type": "exactly_once_ledger", "host": "127.0.0.1", "port": postgres.port, "login": "postgres",
        "schema": LEDGER_DB, "extra": {"application_name": "eo own ledger"}}))
    ledger = LedgerHook(ledger_conn_id="eo_ledger_own").get_conn()
    ledger.ensure_pipeline(pid, "fp", {})
    ledger.create_batch(pid, "run-1", ranges(0, 3), expected_epoch=0)
    assert [b.run_id for b in Ledger(pg_ledger_url).list_batches(pid)] == ["run-1"]
    with ledger.engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW application_name").scalar() == "eo own ledger"


def test_a_read_only_ledger_reads_everything_and_can_write_nothing(ledger, ledger_url, pid):
    """What the ledger page and the backlog trigger use: never a write, never a lock a writer waits for."""
    ledger.ensure_pipeline(pid, "fp", {})
    batch = ledger.create_batch(pid, "run-1", ranges(0, 5), expected_epoch=0)
    ledger.record_dag(pid, "dag_a")
    reader = Ledger.read_only(ledger_url)
    try:
        assert reader.has_schema() and reader.get_batch(batch.id).state is BatchState.PLANNED
        assert reader.pipeline_dags()[pid] == {"dag_a"} and reader.state_counts(pid) == {"PLANNED": 1}
        with reader.engine.connect() as held:  # a reader's open connection does not block the writer
            held.exec_driver_sql("SELECT COUNT(*) FROM aeo_batch").scalar()
            ledger.mark_aborted(batch.id, "the writer goes on while a reader reads")
        assert reader.get_batch(batch.id).state is BatchState.ABORTED
        with pytest.raises(Exception, match="(?i)read-only|readonly"):
            reader.record_event(pid, None, "x", "a reader must not write")
    finally:
        reader.engine.dispose()
