"""Issue 52: the embedded SQLite ledger where a pipeline's tasks may run on several machines.

Which executor a task runs under, and whether it keeps every task on one machine (pure logic on the names,
airflow_integration/executors.py); then the verdict as Airflow's real configuration gives it (set through its
AIRFLOW__SECTION__OPTION variables): an error when a task runs, a warning when the DAG is parsed, and a line of the
CLI and the ledger page that says which ledger they read. tests/integration/test_ledger_on_two_workers.py runs the
pipeline on two workers with their own AIRFLOW_HOMEs against the real broker and PostgreSQL.
"""

from __future__ import annotations

import json
import warnings

import pytest

from airflow_exactly_once.airflow_integration.compat import AirflowFailException
from airflow_exactly_once.airflow_integration.executors import ExecutorEntry, configured_executors, task_executor
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.hooks.ledger import EMBEDDED_LEDGER_FILE, EmbeddedLedgerWarning, LedgerHook
from airflow_exactly_once.operators.batch import NotifyCompleteOperator, PlanBatchOperator

CELERY = "CeleryExecutor"
SHARED = "AIRFLOW__EXACTLY_ONCE__EMBEDDED_LEDGER_SHARED"

# -- which executor, and whether it stays on one machine (pure) ---------------------------------------------------


@pytest.mark.parametrize("setting, own, expected, one_machine", [
    ("LocalExecutor", None, "LocalExecutor", True),
    ("CeleryExecutor", None, "CeleryExecutor", False),
    ("KubernetesExecutor", None, "KubernetesExecutor", False),
    ("airflow.executors.local_executor.LocalExecutor", None, "airflow.executors.local_executor.LocalExecutor", True),
    (" LocalExecutor , CeleryExecutor ", None, "LocalExecutor", True),  # the first entry is the default
    ("CeleryExecutor,LocalExecutor", None, "CeleryExecutor", False),
    ("CeleryExecutor,LocalExecutor", "LocalExecutor", "LocalExecutor", True),  # the task's own executor= wins
    ("LocalExecutor,CeleryExecutor", "CeleryExecutor", "CeleryExecutor", False),
    ("LocalExecutor,pods:my.company.PodExecutor", "pods", "pods:my.company.PodExecutor", False),  # by alias
    ("CeleryExecutor,quick:airflow.executors.local_executor.LocalExecutor", "quick",
     "quick:airflow.executors.local_executor.LocalExecutor", True),
    ("CeleryExecutor,airflow.executors.local_executor.LocalExecutor", "LocalExecutor",
     "airflow.executors.local_executor.LocalExecutor", True),  # by class name
    ("LocalExecutor", "my.company.PodExecutor", "my.company.PodExecutor", False),  # not configured: as written
    ("SequentialExecutor", None, "SequentialExecutor", True),  # Airflow 2's local executors and its test executor
    ("DebugExecutor", None, "DebugExecutor", True),
    ("MockExecutor", None, "MockExecutor", True),
    ("LocalKubernetesExecutor", None, "LocalKubernetesExecutor", False),  # sends some tasks to pods
    ("", None, "LocalExecutor", True),  # unset: Airflow's default
    ("LocalExecutor;team_a=CeleryExecutor", "CeleryExecutor", "CeleryExecutor", False),  # a team's executor
])
def test_the_executor_a_task_runs_under_and_whether_it_stays_on_one_machine(setting, own, expected, one_machine):
    entry = task_executor(own, setting)
    assert str(entry) == expected and entry.runs_on_one_machine is one_machine


def test_the_configured_list_keeps_its_order_aliases_and_team_lists():
    assert configured_executors("LocalExecutor, fast:my.mod.Fast;team=CeleryExecutor") == [
        ExecutorEntry("LocalExecutor"), ExecutorEntry("my.mod.Fast", "fast"), ExecutorEntry("CeleryExecutor")]
    assert configured_executors(None) == configured_executors(" , ") == []


# -- the verdict, from Airflow's configuration ---------------------------------------------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A worker's own AIRFLOW_HOME, under a multi-machine executor, with nothing said about sharing the file."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", CELERY)
    monkeypatch.delenv(SHARED, raising=False)
    return tmp_path / "home"


def test_the_embedded_ledger_is_refused_under_a_multi_machine_executor_with_the_ways_out(home):
    with pytest.raises(ConfigurationError) as refused:
        LedgerHook().get_conn()
    message = str(refused.value)
    assert message.startswith(f"the embedded SQLite ledger (sqlite:///{home / EMBEDDED_LEDGER_FILE}) cannot be used "
                              "under executor CeleryExecutor ([core] executor = 'CeleryExecutor')")
    assert "each worker would keep its own ledger" in message and "write its records again" in message
    assert "ledger_conn_id='<connection>' (an exactly_once_ledger or postgres connection" in message
    assert "set [exactly_once] embedded_ledger_shared = True (AIRFLOW__EXACTLY_ONCE__EMBEDDED_LEDGER_SHARED=True)" \
        in message
    assert refused.value.retriable is False
    assert not home.exists()  # refused before the file (or its folder) was made


def test_a_task_of_its_own_executor_is_judged_by_it(home):
    assert "the task's executor='KubernetesExecutor'" in LedgerHook(executor="KubernetesExecutor").placement_problem()
    assert LedgerHook(executor="LocalExecutor").placement_problem() is None


@pytest.mark.parametrize("how", ["shared", "local executor", "connection", "url"])
def test_the_ways_out(home, monkeypatch, how):
    hook = LedgerHook()
    if how == "shared":
        monkeypatch.setenv(SHARED, "True")
    elif how == "local executor":
        monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor,CeleryExecutor")
    elif how == "connection":
        hook = LedgerHook(ledger_conn_id="exactly_once_ledger_default")
    else:
        hook = LedgerHook(ledger_url=f"sqlite:///{home.parent / 'chosen.db'}")
    assert hook.placement_problem() is None
    hook.check_placement()


def test_which_ledger_is_described_without_its_password(home, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_EO_DESCRIBED", json.dumps({
        "conn_type": "postgres", "host": "db", "port": 5432, "login": "eo", "password": "pa55word", "schema": "l"}))
    described = LedgerHook(ledger_conn_id="eo_described").describe()
    assert described == "postgresql+psycopg2://eo:***@db:5432/l (connection 'eo_described')"
    assert LedgerHook().describe() == (f"sqlite:///{home / EMBEDDED_LEDGER_FILE} "
                                       "(the embedded SQLite file in this machine's AIRFLOW_HOME)")


# -- the operators: a warning when parsed, an error before anything when run ---------------------------------------


def pipeline_args(tmp_path) -> dict:
    # A broker port nobody listens on: a task that asked it would fail later and otherwise.
    return dict(pipeline_id="p", topics="t", bootstrap_servers="127.0.0.1:9",
                sink={"type": "parquet", "path": str(tmp_path / "out")})


def test_parsing_the_dag_warns_and_every_task_fails_for_good_before_it_asks_anything(home, tmp_path):
    with pytest.warns(EmbeddedLedgerWarning, match="pipeline p: its tasks will fail: the embedded SQLite ledger"):
        plan = PlanBatchOperator(task_id="plan", **pipeline_args(tmp_path))
    with pytest.warns(EmbeddedLedgerWarning):
        notify = NotifyCompleteOperator(task_id="notify", batch_id="p:1", **pipeline_args(tmp_path))
    for task in (plan, notify):
        with pytest.raises(AirflowFailException, match=r"^ConfigurationError: the embedded SQLite ledger .* under "
                                                        r"executor CeleryExecutor"):
            task.execute({"run_id": "manual__1"})
    assert not home.exists() and not (tmp_path / "out").exists()


def test_no_warning_where_every_task_stays_on_one_machine(home, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    with warnings.catch_warnings():
        warnings.simplefilter("error", EmbeddedLedgerWarning)
        PlanBatchOperator(task_id="plan", **pipeline_args(tmp_path))
        PlanBatchOperator(task_id="plan_on_pods", executor=CELERY, **pipeline_args(tmp_path),
                          ledger_conn_id="exactly_once_ledger_default")
    with pytest.warns(EmbeddedLedgerWarning, match="the task's executor='CeleryExecutor'"):
        PlanBatchOperator(task_id="plan_on_workers", executor=CELERY, **pipeline_args(tmp_path))


# -- the CLI and the ledger page say which ledger they read --------------------------------------------------------


def test_the_cli_names_the_ledger_it_reads_and_warns_of_the_embedded_one(home, tmp_path, capsys):
    from airflow_exactly_once.cli.main import main

    assert main(["pipelines"]) == 0
    err = capsys.readouterr().err
    assert f"ledger: sqlite:///{home / EMBEDDED_LEDGER_FILE} (the embedded SQLite file in this machine's " \
           "AIRFLOW_HOME)" in err
    assert "warning: this may not be the pipelines' ledger: their tasks refuse it: the embedded SQLite ledger" in err
    url = f"sqlite:///{tmp_path / 'other.db'}"
    assert main(["--ledger-url", url, "pipelines"]) == 0
    assert capsys.readouterr().err == f"ledger: {url} (--ledger-url)\n"


def test_the_page_shows_the_ledger_and_why_it_may_not_be_the_pipelines(home):
    from airflow_exactly_once.ui.app import ledger_warning
    from airflow_exactly_once.ui.page import pipeline_page
    from tests.unit.test_ledger_page import NOW, ids

    hook = LedgerHook()
    warning = ledger_warning(hook)
    assert warning.startswith("This page reads the embedded ledger of the api-server's own AIRFLOW_HOME, which the "
                              "pipelines' tasks refuse: the embedded SQLite ledger")
    assert warning.endswith("Point the page at the pipelines' ledger with [exactly_once] ledger_conn_id (or "
                            "ledger_url).")
    page = pipeline_page(ledger=hook.describe(), now=NOW, pipelines=[], report=None, lag=None, base="/b",
                         ledger_warning=warning)
    assert {"ledger", "ledger-warning"} <= ids(page) and "the embedded SQLite file in this machine" in page
    assert ledger_warning(LedgerHook(ledger_conn_id="exactly_once_ledger_default")) is None
