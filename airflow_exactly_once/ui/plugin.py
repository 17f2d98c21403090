"""The Airflow plugin of the ledger page: a FastAPI app under /exactly-once and an entry in the UI's Browse menu.

Registered by the `airflow.plugins` entry point (what Airflow 3.1 loads by default) and in the
provider metadata ("plugins", what `airflow providers plugins` lists and what Airflow loads
with lazy_discover_providers off); Airflow keeps one plugin per name.

Every Airflow process loads plugins (the scheduler, task processes), so this module stays
cheap: the FastAPI app and what it imports are built on the first request to the api-server.
"""

from __future__ import annotations

import threading
from typing import Any, Callable
from urllib.parse import urlparse

from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/exactly-once"
PAGE_ROUTE = "exactly-once-ledger"  # the UI's address of the page: /plugin/exactly-once-ledger


class LazyApp:
    """An ASGI app that builds the real one (`factory()`) on its first request."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._app: Any = None
        self._lock = threading.Lock()

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if self._app is None:
            with self._lock:
                if self._app is None:
                    self._app = self._factory()
        await self._app(scope, receive, send)


def _create_app() -> Any:
    from airflow_exactly_once.ui.app import create_app

    return create_app()


def base_path(path: str) -> str:
    """`path` under the api-server's base URL path ([api] base_url may carry one, e.g. /airflow)."""
    base = conf.get("api", "base_url", fallback="/") or "/"
    prefix = urlparse(base).path if base.startswith(("http://", "https://")) else base
    return prefix.rstrip("/") + path


class ExactlyOncePlugin(AirflowPlugin):
    """The offset ledger of exactly-once pipelines, read-only, in Airflow's UI."""

    name = "exactly_once"
    fastapi_apps = [{"app": LazyApp(_create_app), "url_prefix": URL_PREFIX, "name": "Exactly-once ledger"}]
    external_views = [{
        "name": "Exactly-once ledger",
        "href": base_path(f"{URL_PREFIX}/ui"),
        "destination": "nav",
        "category": "browse",
        "url_route": PAGE_ROUTE,
    }]
