"""Where the offset ledger lives, from an Airflow connection, a URL, or the embedded default.

The embedded default is a SQLite file in AIRFLOW_HOME: one per machine (per pod, per worker's home). Where a
task may run on another machine than the pipeline's other runs (the executor it runs under is not a local one,
airflow_integration/executors.py), each machine would keep its own ledger, and a run there would start the pipeline
again from startup_mode and write its records a second time. So the hook refuses the embedded file there, before
anything is read or written, unless the deployment says its workers share the file
(`[exactly_once] embedded_ledger_shared`); DAG files get the same verdict as a warning when they are parsed.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from airflow_exactly_once.airflow_integration.compat import BaseHook, config_flag
from airflow_exactly_once.airflow_integration.connections import connection_to_url
from airflow_exactly_once.airflow_integration.placement import several_machines
from airflow_exactly_once.airflow_integration.provider_info import (
    CONFIG_SECTION,
    EMBEDDED_LEDGER_SHARED,
    LEDGER_CONN_FIELDS,
    LEDGER_CONN_TYPE,
    LEDGER_UI_FIELD_BEHAVIOUR,
)
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.ledger import Ledger, redacted_url
from airflow_exactly_once.core.ledger.engine import missing_sqlite_file
from airflow_exactly_once.core.ledger.versioning import UPGRADE_COMMAND

__all__ = ["LedgerHook", "EmbeddedLedgerWarning"]

EMBEDDED_LEDGER_FILE = "exactly_once_ledger.db"
SHARED_SETTING = f"[{CONFIG_SECTION}] {EMBEDDED_LEDGER_SHARED} = True"
SHARED_VARIABLE = f"AIRFLOW__{CONFIG_SECTION.upper()}__{EMBEDDED_LEDGER_SHARED.upper()}=True"


class EmbeddedLedgerWarning(UserWarning):
    """A pipeline on the embedded ledger where its tasks may run on several machines (they will refuse it)."""


def embedded_ledger_url() -> str:
    """The embedded default: a SQLite file beside Airflow's own files."""
    home = os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))
    return f"sqlite:///{Path(home) / EMBEDDED_LEDGER_FILE}"


def embedded_ledger_problem(executor: str | None = None) -> str | None:
    """Why a task under `executor` (its own `executor=` argument; None: Airflow's default) must not use the embedded
    ledger, or None when it may: the executor keeps every task on one machine, or the workers share the file."""
    if config_flag(CONFIG_SECTION, EMBEDDED_LEDGER_SHARED):
        return None
    where = several_machines(executor)
    if where is None:
        return None
    return (f"the embedded SQLite ledger ({embedded_ledger_url()}) cannot be used under {where}: "
            "it may run the pipeline's tasks on several machines, and each worker would keep its own ledger in its "
            "own AIRFLOW_HOME, so a run on another worker would start the pipeline again from startup_mode and write "
            "its records again. Give the pipeline a ledger every worker reaches: ledger_conn_id='<connection>' (an "
            f"{LEDGER_CONN_TYPE} or postgres connection, e.g. {LedgerHook.default_conn_name}) or "
            "ledger_url='postgresql+psycopg2://...'; or, if every worker opens this same file (AIRFLOW_HOME on one "
            f"folder they share, with working file locks), set {SHARED_SETTING} ({SHARED_VARIABLE}).")


class LedgerHook(BaseHook):
    """The offset ledger of exactly-once pipelines (SQLite or PostgreSQL, through SQLAlchemy)."""

    conn_name_attr = "ledger_conn_id"
    default_conn_name = "exactly_once_ledger_default"
    conn_type = LEDGER_CONN_TYPE
    hook_name = "Exactly-once offset ledger"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form's labels and hints, for Airflow < 3.2 (later ones read the provider info)."""
        return {key.replace("-", "_"): value for key, value in LEDGER_UI_FIELD_BEHAVIOUR.items()}

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The `backend` field of the connection form, for Airflow < 3.2 with the FAB UI installed."""
        from flask_appbuilder.fieldwidgets import BS3TextFieldWidget
        from flask_babel import lazy_gettext
        from wtforms import StringField

        return {name: StringField(lazy_gettext(field["label"]), widget=BS3TextFieldWidget(),
                                  description=field["description"])
                for name, field in LEDGER_CONN_FIELDS.items()}

    def __init__(self, ledger_conn_id: str | None = None, ledger_url: str | None = None,
                 executor: str | None = None) -> None:
        """`executor`: the `executor=` of the task that opens the ledger (None: Airflow's default executor)."""
        super().__init__()
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.executor = executor

    @property
    def embedded(self) -> bool:
        """Whether this is the embedded SQLite file (neither a URL nor a connection given)."""
        return not self.ledger_url and not self.ledger_conn_id

    def get_url(self) -> str:
        if self.ledger_url:
            return self.ledger_url
        if self.ledger_conn_id:
            return connection_to_url(self.get_connection(self.ledger_conn_id))
        return embedded_ledger_url()

    def placement_problem(self) -> str | None:
        """Why the task cannot use this ledger where it runs (the embedded file on several machines), or None."""
        return embedded_ledger_problem(self.executor) if self.embedded else None

    def check_placement(self) -> None:
        """Refuse the embedded ledger where the task may run on several machines (not retried: a retry lands on a
        worker just as likely to hold another ledger). Reads only Airflow's configuration: nothing is contacted."""
        problem = self.placement_problem()
        if problem:
            raise ConfigurationError(problem)

    def warn_placement(self, pipeline_id: Any) -> None:
        """When a DAG is parsed: the same verdict as a warning, so that the DAG's author sees it before a run fails."""
        problem = self.placement_problem()
        if problem:
            warnings.warn(f"pipeline {pipeline_id}: its tasks will fail: {problem}", EmbeddedLedgerWarning,
                          stacklevel=2)

    def describe(self) -> str:
        """Which ledger this is, for people (the ledger page, the CLI): its URL without a password, and its origin."""
        origin = ("ledger_url" if self.ledger_url else f"connection {self.ledger_conn_id!r}" if self.ledger_conn_id
                  else "the embedded SQLite file in this machine's AIRFLOW_HOME")
        return f"{redacted_url(self.get_url())} ({origin})"

    def test_connection(self) -> tuple[bool, str]:
        """Airflow's Test button (and `airflow connections test`): reach the ledger and read where its schema stands.
        Nothing is created, migrated or written; an empty database is fine (the first batch creates the schema)."""
        try:
            if missing_sqlite_file(self.get_url()):
                return True, f"the ledger {self._where()} is a SQLite file not made yet: the first batch makes it"
            ledger = Ledger.read_only(self.get_url())
        except Exception as exc:
            return False, f"the ledger {self._where()} cannot be opened: {type(exc).__name__}: {exc}"
        try:
            version = ledger.schema_version()
        except Exception as exc:
            return False, (f"the ledger {self._where()} cannot be read: {type(exc).__name__}: {exc}. Check the "
                           "host, port, database and credentials, and that the server accepts this machine")
        finally:
            ledger.engine.dispose()
        if version.state == "ahead":
            return False, (f"the ledger {self._where()} is {version.describe()}: upgrade the provider where this "
                           "connection is used")
        after = {"empty": "; the first batch creates its tables",
                 "unversioned": f"; the first batch (or `{UPGRADE_COMMAND}`) versions it",
                 "behind": f"; the first batch (or `{UPGRADE_COMMAND}`) upgrades it"}.get(version.state, "")
        return True, f"reached the ledger {self._where()}: schema {version.describe()}{after}"

    def _where(self) -> str:
        return redacted_url(self.get_url())

    def get_conn(self) -> Ledger:
        self.check_placement()
        ledger = Ledger(self.get_url())
        ledger.create_schema()
        return ledger

