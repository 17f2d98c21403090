"""Import paths that DAGs and Airflow name keep working after the modules moved (issue 46, item 5).

A DAG imports `airflow_exactly_once.assets`; an installed 0.1.0 metadata names the provider entry point
`airflow_exactly_once.provider_info:get_provider_info`; Airflow's database keeps the classpath of every trigger it
deferred to. An alias module is the moved module itself, so each old name is the very object the new path holds.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_exactly_once.airflow_integration.provider_info import TRIGGER_MODULES, get_provider_info

ROOT = Path(__file__).resolve().parents[2]
ALIASES = {
    "airflow_exactly_once.assets": "airflow_exactly_once.airflow_integration.assets",
    "airflow_exactly_once.provider_info": "airflow_exactly_once.airflow_integration.provider_info",
}


@pytest.mark.parametrize("old, new", sorted(ALIASES.items()))
def test_an_old_module_path_is_the_moved_module(old, new):
    moved = importlib.import_module(new)
    assert importlib.import_module(old) is moved
    public = [name for name in vars(moved) if not name.startswith("_")]
    assert public, f"{new} has no public name"
    for name in public:
        assert getattr(importlib.import_module(old), name) is getattr(moved, name), name


@pytest.mark.parametrize("old, new", sorted(ALIASES.items()))
def test_an_old_path_works_first_in_a_fresh_process_too(old, new):
    """As in a DAG file parsed by a new process: the old path imported before anything else of the package."""
    code = (f"import importlib, sys; m = importlib.import_module({old!r}); "
            f"assert m is sys.modules[{new!r}] is sys.modules[{old!r}], m; print(m.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == new


def test_an_old_from_import_gives_the_same_objects():
    from airflow_exactly_once.airflow_integration import assets as moved
    from airflow_exactly_once.assets import emit_batch_events, pipeline_asset  # noqa: F401 - what DAGs import

    assert (pipeline_asset, emit_batch_events) == (moved.pipeline_asset, moved.emit_batch_events)


def test_the_entry_point_an_installed_metadata_names_still_loads():
    from airflow_exactly_once.provider_info import get_provider_info as old

    assert old is get_provider_info and old()["package-name"] == "airflow-exactly-once"


def test_the_trigger_classpath_airflow_stored_is_where_the_trigger_is():
    """triggers/ did not move: the classpath a deferred task left in Airflow's database imports the same class."""
    try:  # where the triggerer's import_string lives: airflow.sdk on Airflow 3.3, airflow.utils before
        from airflow.sdk.module_loading import import_string
    except ImportError:
        from airflow.utils.module_loading import import_string

    from airflow_exactly_once.triggers.backlog import PipelineBacklogTrigger

    classpath, _ = PipelineBacklogTrigger(pipeline_id="p", topics=["t"]).serialize()
    assert classpath == "airflow_exactly_once.triggers.backlog.PipelineBacklogTrigger"
    assert import_string(classpath) is PipelineBacklogTrigger
    assert TRIGGER_MODULES == ["airflow_exactly_once.triggers.backlog"]
