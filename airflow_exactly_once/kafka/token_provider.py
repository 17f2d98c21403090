"""kafka-python's `sasl_oauth_token_provider` for OAUTHBEARER logins with OIDC client credentials.

Kept apart from kafka.oauth (the tokens) because it subclasses kafka-python's provider class: only
code that builds kafka-python clients loads it, never a DAG parse.
"""

from __future__ import annotations

from kafka.net.sasl.oauth import AbstractTokenProvider

from airflow_exactly_once.kafka.oauth import ClientCredentials, access_token


class ClientCredentialsTokenProvider(AbstractTokenProvider):
    """kafka-python's `sasl_oauth_token_provider`: a cached client-credentials token at each login."""

    def __init__(self, credentials: ClientCredentials, extensions: dict[str, str] | None = None) -> None:
        super().__init__()
        self.credentials = credentials
        self._extensions = dict(extensions or {})

    def token(self) -> str:
        return access_token(self.credentials)

    def extensions(self) -> dict[str, str]:
        """SASL extensions of the login (sasl.oauthbearer.extensions), e.g. Confluent Cloud's logicalCluster."""
        return dict(self._extensions)

    def __repr__(self) -> str:
        return f"ClientCredentialsTokenProvider({self.credentials!r})"
