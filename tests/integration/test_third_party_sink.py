"""A sink in its own distribution: installed with pip, found through its entry point, run through the protocol.

tests/fixtures/third_party_sink is such a distribution (a "jsonl" sink: a file per batch, published by
rename). It is installed with pip into a folder of its own, never into the virtualenv, and put on the
path of this process or of a pytest it starts; the virtualenv stays as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.sinks import INSTALLED, SPECS, sink_types, spec_type
from airflow_exactly_once.spark.partition_writers import run_partition_writers
from tests.harness import REPO, FakeSource, Pipe, open_ledger, pipeline_config

FIXTURE = REPO / "tests" / "fixtures" / "third_party_sink"
CONTRACT_SCENARIOS = 4  # the contract's test functions, each run once for the jsonl sink


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The jsonl sink's distribution, installed by pip into a folder of its own (built with the virtualenv's
    setuptools: nothing is downloaded)."""
    target = tmp_path_factory.mktemp("site-packages")
    source = tmp_path_factory.mktemp("build") / "third_party_sink"  # pip builds in the tree: a copy's, not the repo's
    shutil.copytree(FIXTURE, source, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(source)],
                   check=True, capture_output=True, text=True, timeout=300)
    assert list(target.glob("exactly_once_jsonl_sink-0.1.0.dist-info/entry_points.txt"))
    return target


@pytest.fixture
def on_path(installed, monkeypatch):
    """The installed distribution seen by this process, as if pip had installed it here; gone again after."""
    monkeypatch.syspath_prepend(str(installed))
    INSTALLED.forget()
    yield installed
    INSTALLED.forget()
    for module in [m for m in sys.modules if m == "jsonl_sink" or m.startswith("jsonl_sink.")]:
        del sys.modules[module]


def test_a_batch_runs_through_an_installed_sink(spark, on_path, tmp_path):
    declaration = spec_type({"type": "jsonl", "path": str(tmp_path)})
    assert declaration.__module__ == "jsonl_sink.spec" and "jsonl" in sink_types() and "jsonl" not in SPECS
    assert Path(sys.modules["jsonl_sink"].__file__).is_relative_to(on_path)  # the installed copy, not the fixture's
    out = tmp_path / "out"
    config = pipeline_config("third-party", ["in"], {"type": "jsonl", "path": str(out)})
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: FakeSource({("in", 0): 6, ("in", 1): 4}),
                run_writers=run_partition_writers)
    planned = pipe.plan("run-1").batch
    assert planned is not None and planned.offset_span == 10
    rows = [(f"k{r.partition}-{o}", f"v{r.partition}-{o}") for r in planned.ranges for o in range(r.start, r.end)]
    frame = spark.createDataFrame(rows, "key STRING, value STRING")
    prepared = pipe.write(planned.id, frame)
    assert prepared.state is BatchState.PREPARED
    assert list(out.glob("batch-*.jsonl")) == []  # staged, invisible

    assert "published batch-000000001.jsonl" in pipe.commit(prepared.id)

    published = (out / "batch-000000001.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["value"] for line in published) == sorted(v for _, v in rows)
    assert len(published) == 10 and list((out / "_staging").iterdir()) == []
    assert pipe.state(prepared.id) is BatchState.COMMITTED
    assert pipe.ledger.committed_positions("third-party") == {("in", 0): 6, ("in", 1): 4}


def test_the_contract_suite_runs_against_an_installed_sink(installed):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(installed), str(FIXTURE)]),
           "AIRFLOW_EXACTLY_ONCE_SINK_ADAPTERS": "contract_adapter:JsonlUnderTest"}
    run = subprocess.run([sys.executable, "-m", "pytest", "tests/integration/test_sink_contract.py", "-k", "jsonl",
                          "-q", "-p", "no:cacheprovider", "-rA"],
                         capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"{CONTRACT_SCENARIOS} passed" in run.stdout, run.stdout[-4000:]
    passed = [line for line in run.stdout.splitlines() if line.startswith("PASSED")]
    assert len(passed) == CONTRACT_SCENARIOS and all("[jsonl]" in line for line in passed), passed
