"""The install matrix: the built wheel, installed without constraints beside the oldest and the newest
Airflow and pyspark that setup.cfg allows, in fresh virtualenvs, as a platform team would install it.

    python -m devtools.install_matrix [--keep] [--work DIR]      (make install-matrix)

1. `python -m build`: an sdist and a wheel; the wheel must hold only the package (with its Ivy
   settings and the example DAGs) and the sdist what its tests need.
2. One fresh virtualenv per stack, under a temporary folder, all at once (pip's cache is shared):
     floor      apache-airflow and pyspark at setup.cfg's floors, with the [spark-submit], [postgres], [s3],
                [schema-registry] and [openlineage] extras (the Spark provider 5.x beside pyspark 3.5, no
                pyspark-client);
     newest     the pins of constraints-newest.txt (newest Airflow 3.x, newest pyspark 4.x with a
                connector on Maven Central), no extras;
     spark-4.1  the newest Airflow beside pyspark 4.1 (PYSPARK_4_1), with the [iceberg] extra: the one line
                no other stack (nor the primary .venv, pyspark 4.0) installs, and the one Iceberg publishes
                a runtime for only from 1.11.0 on.
   pip resolves them with nothing pinned but those two; the time of each install is printed.
3. In each, devtools/install_check.py (see there): every module imports, no deprecation from our
   code, the example DAGs parse, Airflow lists the provider, the CLIs answer, and a local Spark
   session gets the Kafka connector by Spark's own resolution and runs mapInArrow; on spark-4.1 the
   Iceberg sink picks ICEBERG_4_1_RUNTIME and the same session appends to an Iceberg table with it.
Exit status 1, with the reasons, when anything fails.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "airflow_exactly_once"
CHECK_SCRIPT = Path(__file__).with_name("install_check.py")
# What the sdist must carry so that its own tests and examples work.
SDIST_MUST_HAVE = ("LICENSE", "NOTICE", "MANIFEST.in", "setup.py", "setup.cfg", "constraints.txt",
                   "constraints-newest.txt", "docs/install.md", "tests/conftest.py", "tests/helpers.py",
                   "tests/kafka_helpers.py", "tests/unit/test_provider_package.py", "tests/dags/exactly_once_test_dag.py",
                   "devtools/install_check.py", "airflow_exactly_once/spark/ivysettings.xml",
                   "airflow_exactly_once/py.typed", "tests/fixtures/ledger/0.1.0/sqlite.sql",
                   "tests/fixtures/ledger/0.1.0/output/_pipeline")


# pyspark's 4.1 line: its newest release whose Kafka connector resolves from Maven Central (no connector for 4.1.4,
# no spark-token-provider-kafka-0-10 for 4.1.2 and 4.1.3), and the Iceberg runtime the sink must pick there, written
# out here rather than read from sinks/iceberg/runtime.py so that a wrong table fails the check.
PYSPARK_4_1 = "4.1.1"
ICEBERG_4_1_RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.11.0"


@dataclass
class Stack:
    name: str
    airflow: str
    pyspark: str
    extras: tuple[str, ...] = ()
    iceberg_runtime: str = ""  # what the Iceberg sink must pick here; checked (and written with) when set
    install_seconds: float = 0.0
    check_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    report: dict = field(default_factory=dict)


def package_version() -> str:
    """airflow_exactly_once/version.py's __version__, read from the source as setuptools reads it (the one place it
    is written)."""
    match = re.search(r'^__version__ = "([^"]+)"$', (REPO / PACKAGE / "version.py").read_text(), re.M)
    if match is None:
        raise LookupError(f"{PACKAGE}/version.py has no __version__ = \"...\" line")
    return match.group(1)


def floor_versions() -> dict[str, str]:
    """The lower bounds of apache-airflow and pyspark in setup.cfg's install_requires."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    floors = {}
    for line in cfg["options"]["install_requires"].splitlines():
        match = re.match(r"\s*(apache-airflow|pyspark)\s*>=\s*([\w.]+)", line)
        if match:
            floors[match.group(1)] = match.group(2)
    return floors


def pinned_versions(constraints: Path) -> dict[str, str]:
    pins = {}
    for line in constraints.read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and not name.startswith("#"):
            pins[name.lower()] = version
    return pins


def stacks() -> list[Stack]:
    floor = floor_versions()
    newest = pinned_versions(REPO / "constraints-newest.txt")
    return [Stack("floor", floor["apache-airflow"], floor["pyspark"],
                  ("spark-submit", "postgres", "schema-registry", "openlineage", "s3")),
            Stack("newest", newest["apache-airflow"], newest["pyspark"]),
            Stack("spark-4.1", newest["apache-airflow"], PYSPARK_4_1, ("iceberg",), ICEBERG_4_1_RUNTIME)]


# Left out of the copy that is built: version control, virtualenvs, build and run leftovers.
NOT_SOURCES = (".git", ".venv*", "__pycache__", "*.py[cod]", "build", "dist", "*.egg-info", ".pytest_cache",
               "spark-warehouse", "metastore_db", "derby.log", "demo-output", "artifacts")


def build(work: Path) -> tuple[Path, Path, float]:
    """Build the sdist and, from it, the wheel (what `python -m build` does by default).

    From a copy of the working tree: the build writes into its source folder (egg-info), and
    the repository may be in use by another run meanwhile.
    """
    started = time.monotonic()
    source, dist = work / "src", work / "dist"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    result = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
                            capture_output=True, text=True, timeout=900, env=clean_env())
    if result.returncode != 0:
        raise SystemExit(f"python -m build failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    [wheel] = dist.glob("*.whl")
    [sdist] = dist.glob("*.tar.gz")
    return wheel, sdist, time.monotonic() - started


def check_distributions(wheel: Path, sdist: Path) -> list[str]:
    """The wheel is the package alone (plus data and the example DAGs); the sdist can run its tests."""
    problems = []
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = next(n.split("/")[0] for n in names if ".dist-info/" in n)
    strays = [n for n in names if not n.startswith((f"{PACKAGE}/", f"{dist_info}/"))]
    if strays:
        problems.append(f"the wheel holds files outside {PACKAGE}/: {strays[:10]}")
    for forbidden in ("devtools/", "tests/", "benchmarks/", "docker/"):
        if any(forbidden in n for n in names):
            problems.append(f"the wheel holds {forbidden}")
    dags = sorted(p.name for p in (REPO / "dags").glob("*.py"))
    shipped = sorted(n.rsplit("/", 1)[1] for n in names if n.startswith(f"{PACKAGE}/example_dags/"))
    if shipped != dags:
        problems.append(f"the wheel's example_dags/ {shipped} are not dags/ {dags}")
    for required in (f"{PACKAGE}/py.typed", f"{PACKAGE}/spark/ivysettings.xml", f"{dist_info}/licenses/LICENSE",
                     f"{dist_info}/licenses/NOTICE", f"{PACKAGE}/core/ledger/migrations/versions/0001_initial.py",
                     f"{PACKAGE}/core/ledger/migrations/script.py.mako"):
        if required not in names:
            problems.append(f"the wheel lacks {required}")
    metadata = zipfile.ZipFile(wheel).read(f"{dist_info}/METADATA").decode()
    if f"\nVersion: {package_version()}\n" not in metadata:
        problems.append(f"the wheel's version is not airflow_exactly_once.__version__ ({package_version()})")
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    if any("pyspark-client" in line for line in requires):
        problems.append("the wheel's metadata requires pyspark-client")
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name}
    missing = [path for path in SDIST_MUST_HAVE if path not in members]
    missing += [f"dags/{d}" for d in dags if f"dags/{d}" not in members]
    if missing:
        problems.append(f"the sdist lacks {missing}")
    return problems


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would make the venv see the repository or this venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS",
                        "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON") and not k.startswith("AIRFLOW")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def install_and_check(stack: Stack, wheel: Path, work: Path) -> Stack:
    venv = work / stack.name
    python = venv / "bin" / "python"
    started = time.monotonic()
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"],
        [str(python), "-m", "pip", "install", "-q",
         f"{PACKAGE.replace('_', '-')}[{','.join(stack.extras)}] @ {wheel.as_uri()}" if stack.extras else str(wheel),
         f"apache-airflow=={stack.airflow}", f"pyspark=={stack.pyspark}"],
        [str(python), "-m", "pip", "check"],
    ]
    for step in steps:
        result = subprocess.run(step, capture_output=True, text=True, env=clean_env(), timeout=1800)
        if result.returncode != 0:
            stack.problems.append(f"`{' '.join(step[2:])}` failed:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")
            return stack
    stack.install_seconds = time.monotonic() - started

    started = time.monotonic()
    report = work / f"{stack.name}-report.json"
    dags = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / PACKAGE / "example_dags"
    expected = ",".join(sorted(_dag_ids(REPO / "dags")))
    check = subprocess.run(
        [str(python), str(CHECK_SCRIPT), "--dags", str(dags), "--expect-dags", expected,
         "--extras", ",".join(stack.extras), "--spark", "--report", str(report),
         *(["--expect-iceberg-runtime", stack.iceberg_runtime] if stack.iceberg_runtime else [])],
        capture_output=True, text=True, cwd=work, timeout=1800,
        env=clean_env(AIRFLOW_HOME=str(work / f"{stack.name}-airflow-home")))
    stack.check_seconds = time.monotonic() - started
    if report.exists():
        stack.report = json.loads(report.read_text())
        stack.problems.extend(stack.report["problems"])
        if not stack.report["package"].startswith(str(venv)):
            stack.problems.append(f"the checks imported {stack.report['package']}, not the installed wheel")
    if check.returncode != 0 and not stack.problems:
        stack.problems.append(f"install_check.py exited {check.returncode}:\n{check.stdout[-2000:]}{check.stderr[-3000:]}")
    return stack


def _dag_ids(folder: Path) -> set[str]:
    """The dag_id="..." literals of the DAG files: every one must parse."""
    return {m for path in folder.glob("*.py") for m in re.findall(r'dag_id="([^"]+)"', path.read_text())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", help="folder for the build and the virtualenvs (default: a new temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the folder afterwards")
    args = parser.parse_args(argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="aeo-install-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        wheel, sdist, build_seconds = build(work)
        print(f"built {wheel.name} and {sdist.name} in {build_seconds:.0f}s", flush=True)
        problems = check_distributions(wheel, sdist)
        print("wheel and sdist contents: " + ("OK" if not problems else "; ".join(problems)), flush=True)
        matrix = stacks()
        with ThreadPoolExecutor(len(matrix)) as pool:
            done = list(pool.map(lambda s: install_and_check(s, wheel, work), matrix))
        print(f"{'stack':10} {'airflow':8} {'pyspark':8} {'extras':50} {'install':>8} {'checks':>8}  result")
        for s in done:
            print(f"{s.name:10} {s.airflow:8} {s.pyspark:8} {','.join(s.extras) or '-':50} "
                  f"{s.install_seconds:7.0f}s {s.check_seconds:7.0f}s  {'OK' if not s.problems else 'FAILED'}")
            versions = s.report.get("versions", {})
            if versions:
                print("           " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
            if s.report.get("iceberg_runtime"):
                print(f"           Iceberg runtime picked: {s.report['iceberg_runtime']}; rows per append written "
                      f"with it: {s.report.get('spark', {}).get('iceberg_rows_per_append')}")
            problems.extend(f"[{s.name}] {p}" for p in s.problems)
        for problem in problems:
            print(f"PROBLEM: {problem}")
        return 1 if problems else 0
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
