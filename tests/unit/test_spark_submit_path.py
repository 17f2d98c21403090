"""The spark-submit path without a cluster: what is shipped, what is submitted, what is refused,
and the pieces that keep an attempt honest (error report, fence watch, dying with its parent).

Real files, a real SQLite ledger and real processes; nothing here claims a delivery
guarantee (tests/test_pipeline_spark_cluster.py does, on a real cluster).
"""

from __future__ import annotations

import json
import os
import py_compile
import re
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest

from airflow_exactly_once.airflow_integration.compat import AirflowFailException
from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError, FencedError, TransformError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import BatchId, OffsetRange
from airflow_exactly_once.core.write_report import clear_failure, record_failure, recorded_failure
from airflow_exactly_once.hooks.spark_submit import WriteJobSubmitHook
from airflow_exactly_once.operators.batch import WriteBatchOperator
from airflow_exactly_once.spark.fence_watch import FenceWatch
from airflow_exactly_once.spark.packages import kafka_package
from airflow_exactly_once.spark.write_job import EXIT_FOR_GOOD, LEDGER_URL_ENV, SECRETS_ENV

SPARK_REDACTION_REGEX = r"(?i)secret|password|token|access[.]key"  # Spark's spark.redaction.regex default
from airflow_exactly_once.spark.shipping import build_bundle, current_bytecode, transform_source


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.ensure_pipeline("p", "f", {"pipeline_id": "p"})
    ledger.create_batch("p", "run-1", [OffsetRange("t", 0, 0, 10)], expected_epoch=0)
    return ledger


@pytest.fixture
def spark_conn(monkeypatch):
    def use(conn_id: str, host: str, port: int | None, deploy_mode: str) -> str:
        conn = {"conn_type": "spark", "host": host, "extra": {"deploy-mode": deploy_mode}}
        if port:
            conn["port"] = port
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
        return conn_id

    return use


# -- what travels with a submission ------------------------------------------------------

def test_bundle_ships_the_package_and_the_transform_module(tmp_path, monkeypatch):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "my_transforms.py").write_text("def parse(df):\n    return df\n")
    monkeypatch.syspath_prepend(str(dags))
    bundle = build_bundle(tmp_path / "bundle", "my_transforms:parse")

    names = zipfile.ZipFile(bundle.py_files).namelist()
    assert bundle.modules == ("airflow_exactly_once", "my_transforms")
    assert "airflow_exactly_once/spark/write_job.py" in names and "my_transforms.py" in names
    assert not any("__pycache__" in n for n in names)
    assert all(n[:-1] in names for n in names if n.endswith(".pyc"))  # bytecode only beside its source
    # The launcher runs the job's entry point from the zip alone (as spark-submit's Python would).
    run = subprocess.run([sys.executable, str(bundle.launcher), "--help"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(bundle.py_files)}, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "--batch-id" in run.stdout and LEDGER_URL_ENV in run.stdout


def _import_from_zip(bundle_zip, module: str, cwd) -> str:
    """Where a fresh Python that has only the zip on its path loaded `module` from (its __file__)."""
    run = subprocess.run([sys.executable, "-c", f"import {module}; print({module}.__file__)"], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(bundle_zip)}, cwd=cwd)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_bundle_carries_current_bytecode_which_the_workers_load_instead_of_compiling(tmp_path, monkeypatch):
    dags = tmp_path / "dags"
    dags.mkdir()
    source = dags / "my_transforms.py"
    source.write_text("def parse(df):\n    return df\n")
    py_compile.compile(str(source), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    monkeypatch.syspath_prepend(str(dags))

    bundle = build_bundle(tmp_path / "current", "my_transforms:parse")
    assert "my_transforms.pyc" in zipfile.ZipFile(bundle.py_files).namelist()
    assert _import_from_zip(bundle.py_files, "my_transforms", tmp_path).endswith("my_transforms.pyc")

    # Another Python's bytecode (another magic number) in the zip: the worker compiles the source instead.
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(bundle.py_files) as given, zipfile.ZipFile(other, "w") as copy:
        for info in given.infolist():
            data = given.read(info)
            copy.writestr(info, b"\x00\x00\r\n" + data[4:] if info.filename == "my_transforms.pyc" else data)
    assert _import_from_zip(other, "my_transforms", tmp_path).endswith("my_transforms.py")

    # The source changed since it was compiled: its stale bytecode stays home.
    source.write_text("def parse(df):\n    return df.limit(1)\n")
    assert current_bytecode(source) is None
    stale = build_bundle(tmp_path / "stale", "my_transforms:parse")
    assert "my_transforms.pyc" not in zipfile.ZipFile(stale.py_files).namelist()
    assert _import_from_zip(stale.py_files, "my_transforms", tmp_path).endswith("my_transforms.py")


def test_installed_or_missing_transform_modules(tmp_path):
    assert transform_source("json:loads") is None  # standard library: on every Python already
    assert transform_source("pyspark.sql.functions:col") is None  # installed distribution
    assert transform_source("airflow_exactly_once.spark.write_job:main") is None  # in the zip anyway
    with pytest.raises(ConfigurationError, match="'no_such_transforms' cannot be found"):
        transform_source("no_such_transforms:parse")


# -- the submission itself ---------------------------------------------------------------

def test_submit_command_carries_only_the_batch_id(spark_conn, monkeypatch, tmp_path):
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))  # no spark-defaults.conf naming the connector
    conn_id = spark_conn("eo_unit_spark", "spark://127.0.0.1", 7077, "client")
    hook = WriteJobSubmitHook(spark_conn_id=conn_id, batch_id=BatchId("orders", 3),
                              ledger_url="postgresql+psycopg2://eo:s3cr3t@db/ledger",
                              spark_conf={"spark.jars": "/opt/extra.jar", "spark.master": "local[2]",
                                          "spark.executor.memory": "1g"})
    cmd = hook._build_spark_submit_command("launcher.py")
    text = " ".join(cmd)
    assert cmd[cmd.index("--master") + 1] == "spark://127.0.0.1:7077"  # the connection's, not spark_conf's
    assert cmd[cmd.index("--jars") + 1] == "/opt/extra.jar"
    assert "spark.jars=" not in text  # --jars would silently replace it
    # No connector named anywhere: Spark resolves the one matching the installed pyspark.
    assert f"spark.jars.packages={kafka_package()}" in text and "spark.jars.ivySettings=" in text
    assert cmd[-3:] == ["launcher.py", "--batch-id", "orders:3"]
    # The ledger's password travels only under a name Spark's UI redacts, never with the URL.
    assert "s3cr3t" not in text and hook._env_vars[LEDGER_URL_ENV] == "postgresql+psycopg2://eo:***@db/ledger"
    assert json.loads(hook._env_vars[SECRETS_ENV]) == {"config": [], "ledger_password": "s3cr3t"}
    assert re.search(SPARK_REDACTION_REGEX, SECRETS_ENV) and not re.search(SPARK_REDACTION_REGEX, LEDGER_URL_ENV)
    assert f"spark.pyspark.driver.python={sys.executable}" in text and "spark.executor.memory=1g" in text


def test_the_job_gets_the_ledger_password_and_the_configs_secrets_from_its_environment_only(monkeypatch):
    from airflow_exactly_once.core.config import PipelineConfig
    from airflow_exactly_once.spark.write_job import _from_environment, secrets_environment
    from tests.harness import pipeline_config

    config = pipeline_config("p", ["t"], {"type": "postgres", "url": "postgresql://app:sink-pw@db/shop", "table": "o"})
    env = secrets_environment("postgresql+psycopg2://eo:p%40ss@db/ledger", config)
    assert env[LEDGER_URL_ENV] == "postgresql+psycopg2://eo:***@db/ledger"
    monkeypatch.setenv(SECRETS_ENV, env[SECRETS_ENV])
    url, secrets = _from_environment(env[LEDGER_URL_ENV])
    assert url == "postgresql+psycopg2://eo:p%40ss@db/ledger"
    stored = PipelineConfig.from_dict(config.to_stored_dict())
    assert "sink-pw" not in repr(stored) and stored.with_secrets(secrets).sink == config.sink


def test_connector_given_by_the_user_is_not_added(spark_conn):
    conn_id = spark_conn("eo_unit_spark", "spark://127.0.0.1", 7077, "client")
    package = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0"
    hook = WriteJobSubmitHook(spark_conn_id=conn_id, batch_id=BatchId("p", 1), ledger_url="sqlite:////x.db",
                              spark_conf={"spark.jars.packages": package})
    cmd = hook._build_spark_submit_command("launcher.py")
    assert "--jars" not in cmd and f"spark.jars.packages={package}" in " ".join(cmd)
    assert "ivySettings" not in " ".join(cmd)  # the user's resolution, untouched


@pytest.mark.parametrize("host, port, ledger_url, expected", [
    ("spark://127.0.0.1", 7077, "postgresql://db/l", "cannot run Python applications in cluster deploy mode"),
    ("yarn", None, "sqlite:////tmp/ledger.db", "cannot open the embedded SQLite ledger"),
])
def test_cluster_deploy_modes_that_cannot_work_are_refused(spark_conn, host, port, ledger_url, expected):
    conn_id = spark_conn("eo_unit_cluster", host, port, "cluster")
    with pytest.raises(ConfigurationError, match=expected):
        WriteJobSubmitHook(spark_conn_id=conn_id, batch_id=BatchId("p", 1), ledger_url=ledger_url,
                           spark_conf={"spark.jars.packages": "spark-sql-kafka"})


def test_callable_transform_is_refused_before_anything_runs(spark_conn, tmp_path):
    def parse(df):
        return df

    write = WriteBatchOperator(task_id="write", pipeline_id="p", topics="t", bootstrap_servers="127.0.0.1:1",
                               sink={"type": "parquet", "path": str(tmp_path / "out")}, transform=parse,
                               ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}", batch_id="p:1",
                               spark_conn_id=spark_conn("eo_unit_spark", "spark://127.0.0.1", 7077, "client"))
    with pytest.raises(AirflowFailException, match=r"'parse' is a Python callable.*transform='module:function'"):
        write.execute(context={})
    assert not (tmp_path / "ledger.db").exists() and not (tmp_path / "out").exists()  # nothing touched


# -- the job's side of the contract ------------------------------------------------------

def test_job_without_a_ledger_or_pipeline_exits_with_a_clear_message(tmp_path):
    base = [sys.executable, "-m", "airflow_exactly_once.spark.write_job", "--batch-id", "p:1"]
    env = {k: v for k, v in os.environ.items() if k != LEDGER_URL_ENV}
    no_ledger = subprocess.run(base, capture_output=True, text=True, env=env)
    assert no_ledger.returncode == 2 and f"set {LEDGER_URL_ENV}" in no_ledger.stderr
    empty = subprocess.run(base, capture_output=True, text=True,
                           env={**env, LEDGER_URL_ENV: f"sqlite:///{tmp_path / 'empty.db'}"})
    assert empty.returncode == EXIT_FOR_GOOD and "pipeline p is not in the ledger" in empty.stderr


def test_write_report_round_trip(ledger):
    batch_id = BatchId("p", 1)
    claimed = ledger.claim(batch_id)
    record_failure(ledger, batch_id, TransformError("bad transform: boom"), claimed.epoch)
    reported = recorded_failure(ledger, batch_id)
    assert type(reported) is TransformError and not reported.retriable and "boom" in str(reported)

    record_failure(ledger, batch_id, RuntimeError("Py4JNetworkError: Answer from Java side is empty"),
                   claimed.epoch)
    reported = recorded_failure(ledger, batch_id)
    assert type(reported) is ExactlyOnceError and reported.retriable and "RuntimeError" in str(reported)

    ledger.claim(batch_id)  # a newer attempt: the old attempt's report no longer speaks for the batch
    assert recorded_failure(ledger, batch_id) is None
    record_failure(ledger, batch_id, ConfigurationError("no"), None)
    clear_failure(ledger, batch_id)
    assert recorded_failure(ledger, batch_id) is None


def test_fence_watch_fires_when_a_newer_attempt_claims(ledger):
    batch_id, fired = BatchId("p", 1), []
    mine = ledger.claim(batch_id)
    watch = FenceWatch(ledger, batch_id, on_fenced=fired.append, interval=0.1)
    watch.start(mine)
    ledger.mark_prepared(batch_id, mine.epoch, {"records": 10}, 10, 10)  # its own progress is no fence
    seen = watch.checks
    deadline = time.monotonic() + 10
    while watch.checks < seen + 3:  # three looks at the PREPARED batch
        assert time.monotonic() < deadline, "the fence watch stopped looking"
        time.sleep(0.05)
    assert fired == [] and watch.reason is None
    watch.stop()


def test_fence_watch_cancels_an_attempt_that_lost_its_batch(ledger):
    batch_id, fired = BatchId("p", 1), []
    mine = ledger.claim(batch_id)
    watch = FenceWatch(ledger, batch_id, on_fenced=fired.append, interval=0.1)
    watch.start(mine)
    newer = ledger.claim(batch_id)
    deadline = time.monotonic() + 10
    while not fired and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    assert len(fired) == 1 and f"epoch {newer.epoch}" in fired[0]
    error = watch.explain(RuntimeError("Job 0 cancelled"))
    assert isinstance(error, FencedError) and not error.retriable


def test_spark_submit_dies_with_the_process_that_started_it(tmp_path):
    """What SIGKILL of an Airflow task does to the spark-submit it started (see parent_death)."""
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys, time
        from airflow_exactly_once.spark.parent_death import die_with_parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=die_with_parent)
        print(child.pid, flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    survived = _alive(child)
    if survived:
        os.kill(child, signal.SIGKILL)
    assert not survived, "the child outlived its SIGKILLed parent"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead, only not reaped
    except FileNotFoundError:
        return False


def test_store_config_keeps_the_stored_settings_current(ledger):
    ledger.store_config("p", {"pipeline_id": "p", "bootstrap_servers": "moved:9092"})
    assert ledger.pipeline("p")["config"]["bootstrap_servers"] == "moved:9092"
