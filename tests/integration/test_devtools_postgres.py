"""The local PostgreSQL server of the dev environment: lifecycle and CLI (real server, no mocks)."""

from __future__ import annotations

import os
import socket

import pytest

from devtools.__main__ import main
from devtools.ports import reserve_port
from devtools.postgres import LocalPostgres, ensure_postgres_installed


def test_server_binaries_are_found():
    bindir = ensure_postgres_installed()
    for name in ("initdb", "pg_ctl", "postgres"):
        assert os.access(bindir / name, os.X_OK)


def test_restart_keeps_port_and_data(tmp_path):
    pg = LocalPostgres(tmp_path / "pg").start()
    try:
        assert pg.url("db1") == f"postgresql+psycopg2://postgres@127.0.0.1:{pg.port}/db1"
        assert pg.create_database("db1") == pg.url("db1")
        assert pg.create_database("db1") == pg.url("db1")  # exists already: fine
        pg.psql("CREATE TABLE t (x int); INSERT INTO t VALUES (42);", dbname="db1")
        assert pg.psql("SHOW max_prepared_transactions; SHOW server_encoding;").split() == ["20", "UTF8"]
        if os.geteuid() == 0:
            assert pg.data_dir.stat().st_uid != 0  # the server runs as an unprivileged user
        pg.restart()
        assert pg.psql("SELECT x FROM t", dbname="db1").strip() == "42"
        pg.stop(mode="immediate")
        assert not pg.is_running()
        pg.start()
        assert pg.psql("SELECT x FROM t", dbname="db1").strip() == "42"
    finally:
        pg.stop()
    assert not pg.is_running()
    pg.stop()  # stopping a stopped server is a no-op


def test_start_failure_shows_the_server_log(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        pg = LocalPostgres(tmp_path / "pg", port=taken.getsockname()[1])
        with pytest.raises(RuntimeError, match="(?s)did not start.*Address already in use"):
            pg.start(timeout=20)
    assert not pg.is_running()


def test_cli_start_and_stop(tmp_path, capsys):
    data_dir = tmp_path / "cli-pg"
    port = reserve_port()
    assert main(["postgres-start", "--port", str(port), "--data-dir", str(data_dir), "--database", "demo"]) == 0
    assert f"postgresql+psycopg2://postgres@127.0.0.1:{port}/demo" in capsys.readouterr().out
    try:
        pg = LocalPostgres(data_dir, port=port)
        assert pg.is_running()
        assert pg.psql("SELECT current_database()", dbname="demo").strip() == "demo"
    finally:
        assert main(["postgres-stop", "--data-dir", str(data_dir)]) == 0
    assert capsys.readouterr().out.strip() == "stopped"
    assert main(["postgres-stop", "--data-dir", str(data_dir)]) == 0
    assert capsys.readouterr().out.strip() == "no PostgreSQL server was running"
