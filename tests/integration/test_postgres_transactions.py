"""Two-phase commit primitives against a real PostgreSQL server (started in a temp dir).

No mocks and no skips: if the server cannot start, the tests fail with its log.
Every test ends by checking that pg_prepared_xacts holds nothing left under its prefix.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg2
import pytest

from devtools.ports import reserve_port
from devtools.postgres import LocalPostgres
from airflow_exactly_once.core.errors import TransactionLostError
from airflow_exactly_once.sinks.postgres.commit import (
    commit_prepared,
    list_prepared,
    rollback_prepared_matching,
    rollback_prepared,
)
from airflow_exactly_once.sinks.postgres.errors import PostgresTransactionError, PrepareFailed, TwoPhaseNotSupported
from airflow_exactly_once.sinks.postgres.gids import gid_prefix, make_gid
from airflow_exactly_once.sinks.postgres.markers import MARKER_TABLE, ensure_marker_table, list_markers
from airflow_exactly_once.sinks.postgres.prepare import prepare_rows
from airflow_exactly_once.sinks.postgres.server import check_two_phase_supported

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pg = LocalPostgres(tmp_path_factory.mktemp("pg"), max_prepared_transactions=20)
    pg.start()
    pg.create_database("aeo_test")
    ensure_marker_table(pg.dsn("aeo_test"))
    yield pg
    pg.stop()


@pytest.fixture
def dsn(server):
    return server.dsn("aeo_test")


@pytest.fixture
def pipeline(request):
    """A pipeline id unique to the test, so GID prefixes never overlap between tests."""
    return f"t-{request.node.name}"


def query(dsn: str, statement: str, params=()) -> list[tuple]:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def make_table(dsn: str, name: str, key: bool = True) -> str:
    query(dsn, f"DROP TABLE IF EXISTS {name}")
    query(dsn, f"CREATE TABLE {name} (id int {'PRIMARY KEY' if key else ''}, v text NOT NULL)")
    return name


def table_rows(dsn: str, table: str) -> list[tuple]:
    return query(dsn, f"SELECT id, v FROM {table} ORDER BY id, v")


def assert_no_prepared(dsn: str, prefix: str) -> None:
    leftovers = query(dsn, "SELECT gid, database FROM pg_prepared_xacts WHERE left(gid, length(%s)) = %s",
                      (prefix, prefix))
    assert leftovers == [], f"prepared transactions left behind: {leftovers}"


def marker(pipeline: str, batch_seq: int, partition_id: int, **extra) -> dict:
    return {"pipeline_id": pipeline, "batch_seq": batch_seq, "partition_id": partition_id, **extra}


def child_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


PREPARE_IN_CHILD = r"""
import json, sys, time
from airflow_exactly_once.sinks.postgres import prepare as pt
args = json.loads(sys.argv[1])
if args.pop("hang_after_prepare"):
    def hang(conn):  # runs right after PREPARE TRANSACTION, the session still open
        print(json.dumps({"prepared": True}), flush=True)
        time.sleep(120)
    pt.close_quietly = hang
handle = pt.prepare_rows(**args)
print(json.dumps(handle), flush=True)
"""


def prepare_in_child(hang_after_prepare: bool = False, **kwargs) -> subprocess.Popen:
    payload = json.dumps({"hang_after_prepare": hang_after_prepare, **kwargs})
    return subprocess.Popen([sys.executable, "-c", PREPARE_IN_CHILD, payload], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=child_env(), cwd=REPO)


# -- GIDs ------------------------------------------------------------------------------


def test_make_gid_is_short_safe_and_prefixed():
    gid = make_gid("orders-to-pg", 12, 3, 0)
    assert gid == "aeo.orders-to-pg.b12.p3.a0"
    assert gid.startswith(gid_prefix("orders-to-pg", 12)) and gid.startswith(gid_prefix("orders-to-pg"))
    assert not make_gid("orders-to-pg", 120, 3, 0).startswith(gid_prefix("orders-to-pg", 12))
    assert not make_gid("orders", 1, 0, 0).startswith(gid_prefix("order"))

    weird = make_gid("dag/with spaces:and'quotes" + "x" * 500, 2**62, 2**31, 99)
    assert len(weird.encode()) < 200
    assert all(c.isalnum() or c in "_.~-" for c in weird)
    # Different ids never share a slug, even when they clean to the same text.
    assert make_gid("a/b", 1, 0, 0) != make_gid("a_b", 1, 0, 0) != make_gid("a b", 1, 0, 0)
    with pytest.raises(ValueError):
        make_gid("p", -1, 0, 0)
    with pytest.raises(ValueError):
        make_gid("", 1, 0, 0)


# -- prepare / commit ----------------------------------------------------------------


def test_prepare_in_one_process_commit_from_another(server, dsn, pipeline):
    table = make_table(dsn, "t_cross_process")
    gid = make_gid(pipeline, 1, 0, 0)
    child = prepare_in_child(dsn=dsn, gid=gid, table=table, columns=["id", "v"],
                             rows=[[1, "a"], [2, "b"], [3, "c"]], marker=marker(pipeline, 1, 0))
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    handle = json.loads(out)
    assert handle["state"] == "prepared" and handle["gid"] == gid and handle["row_count"] == 3

    assert table_rows(dsn, table) == []  # prepared, not visible
    assert list_prepared(dsn, gid_prefix(pipeline)) == [gid]

    # The SQLAlchemy URL form is accepted too.
    assert commit_prepared(server.url("aeo_test"), gid) == "committed"
    assert table_rows(dsn, table) == [(1, "a"), (2, "b"), (3, "c")]
    assert [m["gid"] for m in list_markers(dsn, pipeline, 1)] == [gid]
    assert_no_prepared(dsn, gid_prefix(pipeline))


def test_commit_twice_is_already_committed_and_rows_appear_once(dsn, pipeline):
    table = make_table(dsn, "t_commit_twice")
    gid = make_gid(pipeline, 7, 2, 1)
    prepare_rows(dsn, gid, table, ["id", "v"], [(10, "x"), (11, "y")], marker(pipeline, 7, 2))
    assert commit_prepared(dsn, gid) == "committed"
    assert commit_prepared(dsn, gid) == "already-committed"
    assert table_rows(dsn, table) == [(10, "x"), (11, "y")]
    # A retried writer whose GID is already committed writes nothing.
    again = prepare_rows(dsn, gid, table, ["id", "v"], [(10, "x"), (11, "y")], marker(pipeline, 7, 2))
    assert again["state"] == "already-committed"
    assert table_rows(dsn, table) == [(10, "x"), (11, "y")]
    assert rollback_prepared(dsn, gid) == "already-committed"
    assert query(dsn, f"SELECT row_count, batch_seq, partition_id FROM {MARKER_TABLE} WHERE gid = %s",
                 (gid,)) == [(2, 7, 2)]
    assert_no_prepared(dsn, gid_prefix(pipeline))


def test_prepared_transaction_survives_server_crash(server, dsn, pipeline):
    table = make_table(dsn, "t_server_crash")
    gid = make_gid(pipeline, 3, 0, 0)
    rows = [(i, f"v{i}") for i in range(5000)]
    prepare_rows(dsn, gid, table, ["id", "v"], rows, marker(pipeline, 3, 0))

    server.stop(mode="immediate")  # a crash: no shutdown checkpoint, WAL recovery on start
    with pytest.raises(PostgresTransactionError) as down:
        commit_prepared(dsn, gid)
    assert down.value.retriable is True
    server.start()

    assert list_prepared(dsn, gid_prefix(pipeline)) == [gid]
    assert table_rows(dsn, table) == []
    assert commit_prepared(dsn, gid) == "committed"
    assert table_rows(dsn, table) == [(i, f"v{i}") for i in range(5000)]
    assert_no_prepared(dsn, gid_prefix(pipeline))


def test_writer_killed_right_after_prepare_then_commit(dsn, pipeline):
    table = make_table(dsn, "t_writer_killed")
    gid = make_gid(pipeline, 4, 1, 0)
    child = prepare_in_child(hang_after_prepare=True, dsn=dsn, gid=gid, table=table, columns=["id", "v"],
                             rows=[[1, "one"], [2, "two"]], marker=marker(pipeline, 4, 1))
    try:
        line = child.stdout.readline()
        assert json.loads(line) == {"prepared": True}, child.stderr.read()
        assert list_prepared(dsn, gid_prefix(pipeline)) == [gid]
    finally:
        child.send_signal(signal.SIGKILL)  # dies with its session still open
        child.wait(30)
    assert child.returncode == -signal.SIGKILL

    assert commit_prepared(dsn, gid) == "committed"
    assert table_rows(dsn, table) == [(1, "one"), (2, "two")]
    assert_no_prepared(dsn, gid_prefix(pipeline))


def test_retried_attempt_replaces_its_earlier_prepare(dsn, pipeline):
    table = make_table(dsn, "t_retry_same_gid")
    gid = make_gid(pipeline, 5, 0, 0)
    prepare_rows(dsn, gid, table, ["id", "v"], [(1, "first try")], marker(pipeline, 5, 0))
    prepare_rows(dsn, gid, table, ["id", "v"], [(1, "second try"), (2, "b")], marker(pipeline, 5, 0))
    assert list_prepared(dsn, gid_prefix(pipeline)) == [gid]
    assert commit_prepared(dsn, gid) == "committed"
    assert table_rows(dsn, table) == [(1, "second try"), (2, "b")]
    assert_no_prepared(dsn, gid_prefix(pipeline))


# -- rollback ------------------------------------------------------------------------


def test_rollback_prepared_discards_rows(dsn, pipeline):
    table = make_table(dsn, "t_rollback")
    gid = make_gid(pipeline, 1, 0, 0)
    prepare_rows(dsn, gid, table, ["id", "v"], [(1, "a")], marker(pipeline, 1, 0))
    assert rollback_prepared(dsn, gid) == "rolled-back"
    assert rollback_prepared(dsn, gid) == "absent"  # idempotent
    assert table_rows(dsn, table) == []
    assert list_markers(dsn, pipeline) == []
    with pytest.raises(TransactionLostError) as lost:
        commit_prepared(dsn, gid)
    assert lost.value.retriable is False
    assert (lost.value.sink, lost.value.lost) == ("postgres", (gid,))
    assert gid in str(lost.value) and "rolled back" in str(lost.value)
    assert_no_prepared(dsn, gid_prefix(pipeline))


def test_rolling_back_matching_gids_keeps_the_others(dsn, pipeline):
    table = make_table(dsn, "t_orphans", key=False)
    gids = [make_gid(pipeline, b, p, a) for b in (1, 2) for p in (0, 1) for a in (0, 1)]
    for gid in gids:
        prepare_rows(dsn, gid, table, ["id", "v"], [(1, gid)], marker(pipeline, 1, 0))
    # Another pipeline whose id starts the same way must not be touched.
    other = make_gid(pipeline + "2", 1, 0, 0)
    prepare_rows(dsn, other, table, ["id", "v"], [(2, other)], marker(pipeline + "2", 1, 0))

    keep = {gids[0], gids[5]}
    dead = lambda gid: gid not in keep  # noqa: E731
    rolled_back = rollback_prepared_matching(dsn, gid_prefix(pipeline), dead)
    assert sorted(rolled_back) == sorted(set(gids) - keep)
    assert sorted(list_prepared(dsn, gid_prefix(pipeline))) == sorted(keep)
    assert list_prepared(dsn, gid_prefix(pipeline + "2")) == [other]
    assert rollback_prepared_matching(dsn, gid_prefix(pipeline), dead) == []
    with pytest.raises(ValueError):
        rollback_prepared_matching(dsn, "", dead)

    for gid in sorted(keep):
        assert commit_prepared(dsn, gid) == "committed"
    assert rollback_prepared(dsn, other) == "rolled-back"
    assert sorted(table_rows(dsn, table)) == sorted((1, gid) for gid in keep)
    assert_no_prepared(dsn, gid_prefix(pipeline))
    assert_no_prepared(dsn, gid_prefix(pipeline + "2"))


# -- errors --------------------------------------------------------------------------


def test_constraint_violation_is_explained_and_leaves_nothing(dsn, pipeline):
    table = make_table(dsn, "t_violation")
    query(dsn, f"INSERT INTO {table} VALUES (1, 'existing')")
    gid = make_gid(pipeline, 1, 0, 0)

    with pytest.raises(PrepareFailed) as dup:
        prepare_rows(dsn, gid, table, ["id", "v"], [(2, "new"), (1, "duplicate")], marker(pipeline, 1, 0))
    message = str(dup.value)
    assert dup.value.retriable is False and dup.value.sqlstate == "23505"
    assert table in message and "t_violation_pkey" in message
    assert "mode='upsert'" in message and "nothing is prepared" in message

    with pytest.raises(PrepareFailed) as null:
        prepare_rows(dsn, gid, table, ["id", "v"], [(3, None)], marker(pipeline, 1, 0))
    assert "'v'" in str(null.value) and "NOT NULL" in str(null.value) and table in str(null.value)

    assert table_rows(dsn, table) == [(1, "existing")]
    assert list_markers(dsn, pipeline) == []
    assert list_prepared(dsn, gid_prefix(pipeline), all_databases=True) == []

    # After fixing the data, the same GID prepares and commits.
    prepare_rows(dsn, gid, table, ["id", "v"], [(2, "new")], marker(pipeline, 1, 0))
    assert commit_prepared(dsn, gid) == "committed"
    assert table_rows(dsn, table) == [(1, "existing"), (2, "new")]
    assert_no_prepared(dsn, gid_prefix(pipeline))


def test_missing_marker_table_and_unknown_table_are_explained(dsn, pipeline):
    query(dsn, "CREATE SCHEMA IF NOT EXISTS no_markers")
    table = make_table(dsn, "t_no_marker")
    gid = make_gid(pipeline, 1, 0, 0)
    with pytest.raises(PrepareFailed, match="ensure_marker_table"):
        prepare_rows(dsn, gid, table, ["id", "v"], [(1, "a")], marker(pipeline, 1, 0), marker_schema="no_markers")
    with pytest.raises(PrepareFailed, match="table no_such_table does not exist"):
        prepare_rows(dsn, gid, "no_such_table", ["id", "v"], [(1, "a")], marker(pipeline, 1, 0))
    assert table_rows(dsn, table) == []
    assert_no_prepared(dsn, gid_prefix(pipeline))


def test_upsert_replaces_by_key(dsn, pipeline):
    table = make_table(dsn, "t_upsert")
    first = make_gid(pipeline, 1, 0, 0)
    prepare_rows(dsn, first, table, ["id", "v"], [(1, "a"), (2, "b")], marker(pipeline, 1, 0))
    assert commit_prepared(dsn, first) == "committed"

    second = make_gid(pipeline, 2, 0, 0)
    handle = prepare_rows(dsn, second, table, ["id", "v"], [(2, "B"), (3, "c"), (3, "C")],
                          marker(pipeline, 2, 0), mode="upsert", key_columns=["id"])
    assert handle["row_count"] == 3 and handle["rows_written"] == 2  # the last row of key 3 wins
    assert table_rows(dsn, table) == [(1, "a"), (2, "b")]  # not visible before commit
    assert commit_prepared(dsn, second) == "committed"
    assert table_rows(dsn, table) == [(1, "a"), (2, "B"), (3, "C")]

    keyless = make_table(dsn, "t_upsert_keyless", key=False)
    with pytest.raises(PrepareFailed) as no_index:
        prepare_rows(dsn, make_gid(pipeline, 3, 0, 0), keyless, ["id", "v"], [(1, "a")],
                     marker(pipeline, 3, 0), mode="upsert", key_columns=["id"])
    assert "CREATE UNIQUE INDEX" in str(no_index.value) and keyless in str(no_index.value)
    with pytest.raises(ValueError, match="key_columns"):
        prepare_rows(dsn, make_gid(pipeline, 3, 0, 0), table, ["id", "v"], [(1, "a")], marker(pipeline, 3, 0),
                     mode="upsert")
    assert_no_prepared(dsn, gid_prefix(pipeline))


def test_connection_failure_is_retriable(pipeline):
    gid = make_gid(pipeline, 1, 0, 0)
    nowhere = f"postgresql://postgres@127.0.0.1:{reserve_port()}/aeo_test"
    for call in (lambda: commit_prepared(nowhere, gid), lambda: rollback_prepared(nowhere, gid),
                 lambda: prepare_rows(nowhere, gid, "t", ["id"], [(1,)], marker(pipeline, 1, 0))):
        with pytest.raises(PostgresTransactionError) as failed:
            call()
        assert failed.value.retriable is True and "Could not connect" in str(failed.value)


def test_two_phase_disabled_server_is_refused_clearly(server, dsn, tmp_path, pipeline):
    assert check_two_phase_supported(dsn) == 20

    disabled = LocalPostgres(tmp_path / "pg-2pc-off", max_prepared_transactions=0).start()
    try:
        off = disabled.dsn("postgres")
        with pytest.raises(TwoPhaseNotSupported) as refused:
            check_two_phase_supported(off)
        message = str(refused.value)
        assert "max_prepared_transactions" in message and "postgresql.conf" in message and "restart" in message
        assert refused.value.retriable is False

        conn = psycopg2.connect(off)
        try:
            with pytest.raises(TwoPhaseNotSupported):
                check_two_phase_supported(conn)
        finally:
            conn.close()

        ensure_marker_table(off)
        table = make_table(off, "t_disabled")
        gid = make_gid(pipeline, 1, 0, 0)
        with pytest.raises(TwoPhaseNotSupported, match="max_prepared_transactions"):
            prepare_rows(off, gid, table, ["id", "v"], [(1, "a")], marker(pipeline, 1, 0))
        assert table_rows(off, table) == []
        assert_no_prepared(off, gid_prefix(pipeline))
    finally:
        disabled.stop()
    assert_no_prepared(dsn, gid_prefix(pipeline))
