"""The package is a real Airflow provider: Airflow's own CLI lists it, and the DAGs import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_airflow_providers_list_shows_the_package(tmp_path):
    airflow = Path(sys.executable).with_name("airflow")
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path)}
    result = subprocess.run([str(airflow), "providers", "list", "-o", "json"], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    providers = {p["package_name"]: p for p in json.loads(result.stdout[result.stdout.index("["):])}
    assert "airflow-exactly-once" in providers
    hooks = subprocess.run([str(airflow), "providers", "hooks", "-o", "json"], env=env, capture_output=True,
                           text=True, timeout=300)
    assert "exactly_once_ledger" in hooks.stdout


def test_example_dags_import_cleanly(tmp_path):
    """Parse dags/ the way the dag-processor does (DagBag), with no import errors."""
    code = (
        "from airflow.models.dagbag import DagBag; import sys; "
        f"bag = DagBag(dag_folder={str(REPO / 'dags')!r}, include_examples=False); "
        "print('ERRORS', bag.import_errors); "
        "print('TASKS', sorted(bag.dags['kafka_to_parquet'].task_ids)); "
        "sys.exit(1 if bag.import_errors else 0)"
    )
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
           "PYTHONPATH": str(REPO / "dags")}  # as the dag-processor does: the DAG folder is importable
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert "ERRORS {}" in result.stdout
    for task in ("plan", "write", "notify_complete", "abort"):
        assert f"'exactly_once.{task}'" in result.stdout
