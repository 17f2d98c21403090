"""Where the offset ledger lives, from an Airflow connection, a URL, or the embedded default."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow_exactly_once.compat import BaseHook
from airflow_exactly_once.connections import connection_to_url
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.provider_info import LEDGER_CONN_FIELDS, LEDGER_CONN_TYPE, LEDGER_UI_FIELD_BEHAVIOUR

EMBEDDED_LEDGER_FILE = "exactly_once_ledger.db"


def embedded_ledger_url() -> str:
    """The embedded default: a SQLite file beside Airflow's own files."""
    home = os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))
    return f"sqlite:///{Path(home) / EMBEDDED_LEDGER_FILE}"


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

    def __init__(self, ledger_conn_id: str | None = None, ledger_url: str | None = None) -> None:
        super().__init__()
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url

    def get_url(self) -> str:
        if self.ledger_url:
            return self.ledger_url
        if self.ledger_conn_id:
            return connection_to_url(self.get_connection(self.ledger_conn_id))
        return embedded_ledger_url()

    def get_conn(self) -> Ledger:
        ledger = Ledger(self.get_url())
        ledger.create_schema()
        return ledger

