"""pyspark's process-wide Spark Connect mark must not stop a later local write from starting its driver."""

from __future__ import annotations

import os
import sys
import types

from airflow_exactly_once.spark.in_process_session import CONNECT_MODE_ENV, drop_stale_connect_mode


def _connect_module(default_session) -> types.ModuleType:
    module = types.ModuleType("pyspark.sql.connect.session")
    module.SparkSession = type("SparkSession", (), {"_default_session": default_session,
                                                   "getActiveSession": classmethod(lambda cls: None)})
    return module


def test_a_mark_left_by_a_closed_or_parent_connect_session_is_dropped(monkeypatch):
    monkeypatch.setenv(CONNECT_MODE_ENV, "1")
    monkeypatch.delitem(sys.modules, "pyspark.sql.connect.session", raising=False)  # inherited from a parent
    assert drop_stale_connect_mode() and CONNECT_MODE_ENV not in os.environ

    monkeypatch.setenv(CONNECT_MODE_ENV, "1")
    monkeypatch.setitem(sys.modules, "pyspark.sql.connect.session",
                        _connect_module(types.SimpleNamespace(is_stopped=True)))  # stopped in this process
    assert drop_stale_connect_mode() and CONNECT_MODE_ENV not in os.environ


def test_the_mark_of_an_open_connect_session_stays(monkeypatch):
    monkeypatch.setenv(CONNECT_MODE_ENV, "1")
    monkeypatch.setitem(sys.modules, "pyspark.sql.connect.session",
                        _connect_module(types.SimpleNamespace(is_stopped=False)))
    assert not drop_stale_connect_mode() and os.environ[CONNECT_MODE_ENV] == "1"


def test_nothing_to_drop(monkeypatch):
    monkeypatch.delenv(CONNECT_MODE_ENV, raising=False)
    assert not drop_stale_connect_mode() and CONNECT_MODE_ENV not in os.environ


def test_spark_connect_errors_name_the_server_never_its_token_and_keep_their_cause():
    from airflow_exactly_once.core.errors import raise_explained
    from airflow_exactly_once.spark.connect_server.session import SparkConnectUnavailable, explain, server_address

    url = "sc://spark.example:15002/;token=s3cret;user_id=etl"
    assert server_address(url) == "sc://spark.example:15002"
    grpc_error = RuntimeError("<_MultiThreadedRendezvous: StatusCode.UNAVAILABLE failed to connect to all addresses>")
    try:
        try:
            raise RuntimeError("[RETRIES_EXCEEDED] The maximum number of retries has been exceeded.") from grpc_error
        except RuntimeError as exc:
            raise_explained(explain(exc, url), exc)
    except SparkConnectUnavailable as explained:
        assert "cannot be reached" in str(explained) and "UNAVAILABLE" in str(explained)
        assert "s3cret" not in str(explained) and "sc://spark.example:15002" in str(explained)
        assert explained.__cause__.__cause__ is grpc_error  # the real cause is kept
    unexplained = ValueError("something else")
    try:
        raise_explained(explain(unexplained, url), unexplained)
    except ValueError as same:
        assert same is unexplained and same.__cause__ is None  # raised as it is, not "from" itself
