"""The install matrix (devtools/install_matrix.py): the built wheel in fresh virtualenvs beside the
oldest and the newest Airflow and pyspark that setup.cfg allows, and beside pyspark 4.1 (with an Iceberg
write on the runtime the sink picks there), resolved by pip without constraints.

Needs the package registries (PyPI, and Maven Central for Spark's own resolution of the Kafka
connector); without them it fails, it never skips. `make test` runs it last, once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(2400)
def test_wheel_installs_and_works_beside_the_oldest_and_newest_airflow_and_pyspark_and_pyspark_4_1(capsys):
    result = subprocess.run([sys.executable, "-m", "devtools.install_matrix"], cwd=REPO, capture_output=True,
                            text=True, timeout=2300)
    with capsys.disabled():  # the table of install times belongs in the test log, pass or fail
        print("\n" + result.stdout, end="")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-4000:]
    table = result.stdout.split("stack ", 1)[1]
    assert "FAILED" not in table and table.count(" OK") == 3
    assert "Iceberg runtime picked: org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.11.0; rows per append " \
           "written with it: [[0, 3], [1, 3]]" in table, table
