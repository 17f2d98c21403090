"""pyiceberg's REST catalog client as the Iceberg sink uses it: bounded waits, and what its failures mean.

pyiceberg's RestCatalog sends its requests through a `requests` session without any timeout, so a
catalog that accepts a connection and never answers would hold notify_complete forever. Here every
request is bounded by Iceberg's own REST client properties (`rest.client.connection-timeout-ms`,
`rest.client.socket-timeout-ms`), the same ones Spark's Java client reads. A commit is never sent
twice by the transport (no transport retries): an answer that does not come is an unknown outcome,
resolved by the next attempt reading the table (table_committer.py).
"""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError, MissingExtraError, SinkError

try:
    import requests
    from pyiceberg.catalog.rest import RestCatalog
    from pyiceberg.exceptions import (CommitStateUnknownException, ForbiddenError, OAuthError, RESTError, ServerError,
                                      ServiceUnavailableError, TooManyRequestsError, UnauthorizedError)
    from requests import PreparedRequest, Response
    from requests.adapters import HTTPAdapter
except ImportError as exc:  # the [iceberg] extra is not installed
    raise MissingExtraError("the Iceberg sink's REST catalog", "iceberg", exc.name) from exc

from airflow_exactly_once.sinks.iceberg.outcomes import outcome_unknown

CONNECT_TIMEOUT = "rest.client.connection-timeout-ms"
SOCKET_TIMEOUT = "rest.client.socket-timeout-ms"
JAVA_DEFAULT_TIMEOUT_MS = 180_000  # what Iceberg's Java HTTPClient waits when the properties are not set
_TRANSPORT = (requests.ConnectionError, requests.Timeout)


class _BoundedAdapter(HTTPAdapter):
    """Every request of the session waits at most (connect, read) seconds unless the caller says otherwise."""

    def __init__(self, timeout: tuple[float, float]) -> None:
        super().__init__(max_retries=0)  # a commit is never re-sent by the transport
        self.timeout = timeout

    def send(self, request: PreparedRequest, stream: bool = False,
             timeout: float | tuple[float | None, float | None] | None = None, verify: bool | str = True,
             cert: str | tuple[str, str] | None = None, proxies: dict[str, str] | None = None) -> Response:
        return super().send(request, stream=stream, timeout=self.timeout if timeout is None else timeout,
                            verify=verify, cert=cert, proxies=proxies)


class BoundedRestCatalog(RestCatalog):
    """RestCatalog whose requests wait no longer than the catalog's timeout properties say."""

    def _create_session(self) -> requests.Session:
        session = super()._create_session()
        timeout = (int(self.properties.get(CONNECT_TIMEOUT, JAVA_DEFAULT_TIMEOUT_MS)) / 1000,
                   int(self.properties.get(SOCKET_TIMEOUT, JAVA_DEFAULT_TIMEOUT_MS)) / 1000)
        adapter = _BoundedAdapter(timeout)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        return session


def open_catalog(name: str, properties: dict[str, str]) -> Any:
    return BoundedRestCatalog(name, **properties)


def is_commit_failure(exc: Exception) -> bool:
    """Whether a failed commit request may have been applied: no answer, or a server error (5xx)."""
    return isinstance(exc, (CommitStateUnknownException, ServerError, ServiceUnavailableError, *_TRANSPORT))


def refused(uri: str, exc: Exception) -> SinkError:
    return SinkError(f"the Iceberg REST catalog at {uri} refused the sink's credentials ({type(exc).__name__}: "
                     f"{str(exc)[:300]}): give the catalog a valid 'token', or a 'credential' "
                     "('<client id>:<client secret>') its OAuth2 server accepts (with 'oauth2-server-uri' and "
                     "'scope' in 'properties' if it needs them), or fix the password of the catalog's Airflow "
                     "connection (conn_id)", retriable=False)


def failure(exc: Exception, *, uri: str, warehouse: str | None, table: str | None = None,
            committing: str | None = None, connecting: bool = False) -> ExactlyOnceError | None:
    """What a REST catalog error means for the pipeline, or None when it is not the catalog's (a bug to raise).

    `committing`: what was being committed (a commit that got no answer has an unknown outcome);
    `connecting`: the error came while reading the catalog's configuration (where it refuses a warehouse).
    """
    if isinstance(exc, (UnauthorizedError, ForbiddenError, OAuthError)):
        return refused(uri, exc)
    if committing is not None and is_commit_failure(exc):
        return outcome_unknown(table or "?", committing, f"the Iceberg REST catalog at {uri}", exc)
    if isinstance(exc, (*_TRANSPORT, ServerError, ServiceUnavailableError, TooManyRequestsError)):
        return SinkError(f"cannot reach the Iceberg REST catalog at {uri}: {type(exc).__name__}: {str(exc)[:300]}. "
                         "Check that the catalog server is up and that the sink's catalog 'uri' (or the host of its "
                         "Airflow connection) points at it", retriable=True)
    if connecting and isinstance(exc, RESTError):
        if warehouse:
            return ConfigurationError(
                f"the Iceberg REST catalog at {uri} does not serve the warehouse {warehouse!r} ({str(exc)[:300]}): "
                "set the sink's 'warehouse' to one the catalog serves (its name, or its location, as the catalog "
                "expects)")
        return ConfigurationError(f"the Iceberg REST catalog at {uri} refused its configuration request "
                                  f"({str(exc)[:300]}): check the 'uri' (the catalog's base, without /v1) and whether "
                                  "the catalog needs a 'warehouse'")
    return None
