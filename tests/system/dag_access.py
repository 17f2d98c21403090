"""An auth manager configuration that limits DAG access per user, for the ledger page's permission tests.

Airflow's SimpleAuthManager gives access by role only: every user with a role can read every
DAG. Production auth managers (FAB, Keycloak, ...) grant DAGs one by one; this subclass does
the same for the users named in EO_TEST_DAG_ACCESS ({"alice": ["dag_a"]}): they read only
those DAGs, and not "all DAGs". Everything else is SimpleAuthManager's (login, tokens, roles).
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

ENV = "EO_TEST_DAG_ACCESS"


def _limits() -> dict[str, set[str]]:
    return {user: set(dags) for user, dags in json.loads(os.environ.get(ENV) or "{}").items()}


class DagAccessAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        allowed = _limits().get(user.get_name())
        if allowed is not None and (details is None or details.id is None or details.id not in allowed):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
