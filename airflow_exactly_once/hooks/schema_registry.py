"""The Schema Registry of topics in the wire format, from an Airflow connection of type `schema_registry`.

Host is the registry's URL (`https://registry.example.com:8081`, or a host name with the
port field); Login and Password are basic auth, a Password without a Login is a bearer
token; the extra holds the TLS files (`ssl.ca.location`, `ssl.certificate.location`,
`ssl.key.location`, `ssl.key.password`) and any other setting of confluent-kafka's
SchemaRegistryClient. The settings travel in the pipeline's config with their secrets
declared (core.config.REGISTRY_SECRET_KEYS): masked, never stored in the ledger.
"""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.airflow_integration.compat import BaseHook
from airflow_exactly_once.airflow_integration.provider_info import REGISTRY_CONN_TYPE, REGISTRY_UI_FIELD_BEHAVIOUR
from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError
from airflow_exactly_once.core.secrets import shown_url
from airflow_exactly_once.records.registry import Registry

__all__ = ["SchemaRegistryHook"]


class SchemaRegistryHook(BaseHook):
    """A Confluent-compatible Schema Registry (Confluent, Apicurio's ccompat API, Karapace, Redpanda)."""

    conn_name_attr = "schema_registry_conn_id"
    default_conn_name = "schema_registry_default"
    conn_type = REGISTRY_CONN_TYPE
    hook_name = "Schema Registry (Confluent-compatible)"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The connection form's labels and hints, for Airflow < 3.2 (later ones read the provider info)."""
        return {key.replace("-", "_"): value for key, value in REGISTRY_UI_FIELD_BEHAVIOUR.items()}

    def __init__(self, schema_registry_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.schema_registry_conn_id = schema_registry_conn_id

    def client_settings(self) -> dict[str, Any]:
        """The connection as confluent-kafka SchemaRegistryClient settings (url, auth, TLS files)."""
        try:
            conn = self.get_connection(self.schema_registry_conn_id)
        except Exception as exc:
            raise ConfigurationError(
                f"the Schema Registry connection {self.schema_registry_conn_id!r} cannot be read ({exc}): create "
                "it (type schema_registry, Host 'https://registry:8081', Login/Password for basic auth)") from exc
        return registry_settings(conn.host, conn.port, conn.login, conn.password, conn.extra_dejson,
                                 self.schema_registry_conn_id)

    def test_connection(self) -> tuple[bool, str]:
        """Airflow's Test button (and `airflow connections test`): list the registry's subjects with the
        connection's URL, credentials and TLS files; a refusal says which of them to fix."""
        try:
            registry = Registry.of_settings(self.client_settings(), f"connection {self.schema_registry_conn_id!r}")
            subjects = registry.call("list its subjects", lambda: registry.client().get_subjects())
        except ExactlyOnceError as exc:
            return False, str(exc)
        return True, f"reached the Schema Registry at {shown_url(registry.url)}: {len(subjects)} subject(s)"


def registry_settings(host: str | None, port: int | None, login: str | None, password: str | None,
                      extra: dict[str, Any], conn_id: str) -> dict[str, Any]:
    """Client settings from a connection's fields; a ConfigurationError names what the connection lacks."""
    if not host:
        raise ConfigurationError(f"the Schema Registry connection {conn_id!r} has no Host: set it to the registry's "
                                 "URL, e.g. https://registry.example.com:8081")
    url = host if "://" in host else f"http://{host}"
    if port and url.count(":") < 2:
        url = f"{url.rstrip('/')}:{port}"
    settings: dict[str, Any] = {"url": url}
    if login:
        settings["basic.auth.user.info"] = f"{login}:{password or ''}"
    elif password:
        settings.update({"bearer.auth.credentials.source": "STATIC_TOKEN", "bearer.auth.token": password,
                         "bearer.auth.logical.cluster": extra.get("bearer.auth.logical.cluster", "default")})
    settings.update({k: v for k, v in extra.items() if v not in (None, "")})
    return settings
