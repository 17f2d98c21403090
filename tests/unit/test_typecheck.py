"""The package type-checks with mypy at the level setup.cfg's [mypy] states (docs/testing.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_type_checks_with_mypy():
    result = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "setup.cfg", "airflow_exactly_once"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"mypy reports errors (fix the code, not the checker):\n{output}"
    assert "Success: no issues found" in output, output
