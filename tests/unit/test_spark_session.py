"""pyspark's process-wide Spark Connect mark must not stop a later local write from starting its driver."""

from __future__ import annotations

import os
import sys
import types

from airflow_exactly_once.spark.session import CONNECT_MODE_ENV, drop_stale_connect_mode


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
