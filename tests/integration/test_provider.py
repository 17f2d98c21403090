"""The package is a real Airflow provider in the environment the tests run in.

devtools/install_check.py, the checks the install matrix runs in fresh virtualenvs, run here on
the test stack (the primary one, and the newest one under `make test-newest`): every module
imports with no deprecation warning from our code, the example DAGs parse as under the
dag-processor, `airflow providers list` shows the package, the CLIs answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import airflow

from airflow_exactly_once.airflow_integration.compat import airflow_release
from airflow_exactly_once.sinks.iceberg.runtime import ICEBERG_SPARK_RUNTIME
from airflow_exactly_once.spark.packages import spark_version


def iceberg_runtime_exists() -> bool:
    return ICEBERG_SPARK_RUNTIME.release_for(".".join(spark_version().split(".")[:2])) is not None

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_DAGS = ("kafka_to_kafka", "kafka_to_parquet", "kafka_to_parquet_hourly", "kafka_to_parquet_on_arrival",
                "kafka_to_parquet_on_spark", "kafka_to_parquet_s3", "kafka_to_postgres")


def test_install_checks_pass_in_the_test_environment(tmp_path):
    report = tmp_path / "report.json"
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow-home")}
    result = subprocess.run(
        [sys.executable, str(REPO / "devtools" / "install_check.py"), "--dags", str(REPO / "dags"),
         "--expect-dags", ",".join(EXAMPLE_DAGS), "--extras", "spark-submit,postgres", "--report", str(report)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert report.exists(), result.stdout[-2000:] + result.stderr[-3000:]
    data = json.loads(report.read_text())
    assert data["problems"] == []
    assert result.returncode == 0
    # Every extra is installed on the test stacks, so every module imports.
    assert set(data["modules"].values()) == {"ok"}
    assert data["deprecations_from_us"] == []
    assert data["dags"]["import_errors"] == {}
    # The example Iceberg DAG parses where Iceberg has a Spark runtime for the installed pyspark's line; elsewhere
    # (pyspark 4.2) it is refused, with the error that names the line and the ones that have a runtime.
    if iceberg_runtime_exists():
        assert data["dags"]["refused"] == {} and "kafka_to_iceberg" in data["dags"]["dags"]
    else:
        assert [Path(f).name for f in data["dags"]["refused"]] == ["kafka_to_iceberg.py"]
        assert "Spark 3.5 (Scala 2.12 or 2.13), 4.0 (Scala 2.13) and 4.1 (Scala 2.13)" in \
            next(iter(data["dags"]["refused"].values()))
    assert data["dags"]["dags"]["kafka_to_parquet"] == [
        "exactly_once.abort", "exactly_once.notify_complete", "exactly_once.plan", "exactly_once.write"]
    assert data["provider"]["listed_version"] == "0.1.0" and data["provider"]["ledger_connection_type"]
    assert data["provider"]["ledger_page"] == ["/exactly-once", "/exactly-once/ui"]
    assert data["cli"]["console script"]
    # Provider CLI commands exist from Airflow 3.2 on; older releases ignore the provider info's `cli` key.
    assert data["cli"].get("airflow exactly-once", False) == (airflow_release(airflow.__version__) >= (3, 2, 0))
