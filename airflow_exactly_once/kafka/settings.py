"""Kafka client settings: read once, from the official `kafka` connection, and translated for every client.

The official Kafka provider keeps a connection's client settings in its extra as librdkafka
properties ("bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.username",
"sasl.password", "ssl.ca.location", ...) and hands them to confluent-kafka as they are. A
pipeline's `kafka_config` adds to them, in the same spelling (kafka-python's underscored
names are accepted too). Three kinds of client then need the same settings in their own
words, and this module is the only place that speaks them:

* kafka-python (planning on the driver, the Kafka sink's probes, committer and writers):
  keyword arguments such as `sasl_plain_username` or `ssl_cafile`;
* Kafka's Java client inside Spark (the Kafka source reads with `kafka.`-prefixed options):
  `sasl.jaas.config`, PEM trust and key stores;
* librdkafka (confluent-kafka), whose property names are the connection's own.

Certificates are files in PEM (what librdkafka and Python's ssl module read); Java's client
reads PEM as well, so a JKS trust store is refused with the setting to use instead.

What a client's failure says about the settings (a wrong password, an untrusted certificate, a
missing ACL) is kafka.access's to tell; the names of the settings, and which are secrets, are
kafka.setting_names'.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.kafka.oauth import ClientCredentials, access_token
from airflow_exactly_once.kafka.setting_names import (
    FORBIDDEN,
    JAVA_ONLY,
    KAFKA_PYTHON_NAMES,
    KAFKA_PYTHON_ONLY,
    LIBRDKAFKA_ONLY,
    SECRETS,
    canonical_name,
)

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
OAUTHBEARER = "OAUTHBEARER"
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", OAUTHBEARER)

# Java's client: the login module and the handler that fetches client-credentials tokens (Kafka clients 3.4 and
# later, 4.x included; the `.secured.` package name of 3.1-3.3 is deprecated in 3.x and gone in 4.0).
_OAUTH_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
_OAUTH_LOGIN_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class KafkaSettings:
    """Bootstrap servers, where they came from (for error messages), and the other client properties."""

    bootstrap_servers: str
    properties: Mapping[str, str] = field(default_factory=dict)
    origin: str = "bootstrap_servers"

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any] | None, *, bootstrap_servers: str | None = None,
                     origin: str = "kafka_config") -> "KafkaSettings":
        """Settings in either spelling; `bootstrap_servers` wins over a 'bootstrap.servers' entry."""
        properties: dict[str, str] = {}
        for key, value in (settings or {}).items():
            if value is None:
                continue
            name = canonical_name(key)
            properties[name] = _text(value)
        servers = bootstrap_servers or properties.pop("bootstrap.servers", "")
        properties.pop("bootstrap.servers", None)
        forbidden = sorted(set(FORBIDDEN) & set(properties))
        if forbidden:
            raise ConfigurationError(
                f"{origin} must not set {', '.join(forbidden)}: the ledger owns offsets and reads are always "
                "read_committed; remove them")
        return cls(str(servers).strip(), properties, origin if servers else "")

    @classmethod
    def of(cls, config: PipelineConfig) -> "KafkaSettings":
        """A pipeline's source cluster client settings."""
        return cls.from_mapping(config.kafka_config, bootstrap_servers=config.bootstrap_servers,
                                origin=config.kafka_origin)

    def merged(self, overrides: Mapping[str, Any] | None, origin: str = "kafka_config") -> "KafkaSettings":
        """These settings with `overrides` on top (a pipeline's kafka_config over its connection)."""
        if not overrides:
            return self
        extra = KafkaSettings.from_mapping(overrides, origin=origin)
        servers = extra.bootstrap_servers or self.bootstrap_servers
        return KafkaSettings(servers, {**self.properties, **extra.properties},
                             extra.origin if extra.bootstrap_servers else self.origin)

    def require_servers(self) -> "KafkaSettings":
        if not self.bootstrap_servers:
            raise ConfigurationError(
                "no Kafka bootstrap servers: give the pipeline a kafka connection whose extra has "
                '{"bootstrap.servers": "host:port"} (kafka_conn_id=...), or pass bootstrap_servers="host:port"')
        return self

    # -- security, checked once ----------------------------------------------------

    @property
    def security_protocol(self) -> str:
        return self.properties.get("security.protocol", "PLAINTEXT").upper()

    def check(self) -> "KafkaSettings":
        """Refuse combinations no client can use, naming the setting to change."""
        protocol = self.security_protocol
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigurationError(f"security.protocol={protocol!r} ({self.origin}) is not one of "
                                     f"{', '.join(SECURITY_PROTOCOLS)}")
        if protocol.startswith("SASL"):
            mechanism = self.properties.get("sasl.mechanism", "").upper()
            if mechanism not in SASL_MECHANISMS:
                raise ConfigurationError(
                    f"security.protocol={protocol} needs sasl.mechanism set to one of {', '.join(SASL_MECHANISMS)} "
                    f"({self.origin} has {mechanism or 'none'})")
            if mechanism == OAUTHBEARER:
                method = self.properties.get("sasl.oauthbearer.method", "oidc").lower()
                if method != "oidc":
                    raise ConfigurationError(
                        f"sasl.oauthbearer.method={method!r} ({self.origin}): only OIDC client credentials are "
                        "supported (every client of a pipeline must fetch its own tokens): set "
                        "sasl.oauthbearer.method=oidc with sasl.oauthbearer.client.id, sasl.oauthbearer.client.secret "
                        "and sasl.oauthbearer.token.endpoint.url")
                self.oauth_client()
            else:
                self.sasl_login()
        truststore = self.properties.get("ssl.truststore.location")
        if truststore and self.properties.get("ssl.truststore.type", "JKS").upper() != "PEM" \
                and "ssl.ca.location" not in self.properties:
            raise ConfigurationError(
                f"ssl.truststore.location={truststore} ({self.origin}) is a Java key store, which the Python "
                "clients (planning, the Kafka sink) cannot read: give the CA certificate as PEM in ssl.ca.location")
        if "ssl.keystore.location" in self.properties and "ssl.certificate.location" not in self.properties:
            raise ConfigurationError(
                f"ssl.keystore.location ({self.origin}) is a Java key store, which the Python clients cannot read: "
                "give the client certificate and key as PEM files in ssl.certificate.location and ssl.key.location")
        return self

    @property
    def sasl_mechanism(self) -> str:
        return self.properties.get("sasl.mechanism", "").upper()

    @property
    def uses_oauth(self) -> bool:
        """OAUTHBEARER logins with OIDC client-credentials tokens."""
        return self.security_protocol.startswith("SASL") and self.sasl_mechanism == OAUTHBEARER

    def oauth_client(self) -> ClientCredentials:
        """The OIDC client of an OAUTHBEARER login, from librdkafka's sasl.oauthbearer.* settings (or the
        clientId/clientSecret/scope options of a Java-style sasl.jaas.config); refused when a part is missing."""
        jaas = self._jaas_options()
        client_id = self.properties.get("sasl.oauthbearer.client.id", jaas.get("clientId", ""))
        secret = self.properties.get("sasl.oauthbearer.client.secret", jaas.get("clientSecret", ""))
        endpoint = self.properties.get("sasl.oauthbearer.token.endpoint.url", "")
        missing = [name for name, value in (("sasl.oauthbearer.client.id", client_id),
                                            ("sasl.oauthbearer.client.secret", secret),
                                            ("sasl.oauthbearer.token.endpoint.url", endpoint)) if not value]
        if missing:
            raise ConfigurationError(
                f"sasl.mechanism=OAUTHBEARER needs the OIDC client-credentials settings: set {', '.join(missing)} "
                f"(with sasl.oauthbearer.method=oidc, and sasl.oauthbearer.scope if the provider wants one) in "
                f"{self.origin}")
        scope = self.properties.get("sasl.oauthbearer.scope", jaas.get("scope", ""))
        return ClientCredentials(endpoint, client_id, secret, scope, self.origin)

    def oauth_extensions(self) -> dict[str, str]:
        """SASL extensions sent with an OAUTHBEARER login (librdkafka's "key=value,key=value" form, e.g. Confluent
        Cloud's logicalCluster and identityPoolId)."""
        pairs = [p.partition("=") for p in self.properties.get("sasl.oauthbearer.extensions", "").split(",")
                 if p.strip()]
        return {k.strip(): v.strip() for k, _, v in pairs}

    def _jaas_options(self) -> dict[str, str]:
        """The quoted options of sasl.jaas.config (username, password; clientId, clientSecret, scope), unescaped."""
        return {k: v.replace('\\"', '"').replace("\\\\", "\\")
                for k, v in _JAAS_OPTION.findall(self.properties.get("sasl.jaas.config", ""))}

    def sasl_credentials(self) -> tuple[str | None, str | None]:
        """(username, password) from sasl.username/password, else parsed out of sasl.jaas.config."""
        username, password = self.properties.get("sasl.username"), self.properties.get("sasl.password")
        if username is None or password is None:
            options = self._jaas_options()
            username = username if username is not None else options.get("username")
            password = password if password is not None else options.get("password")
        return username, password

    def sasl_login(self) -> tuple[str, str]:
        """The (username, password) a SASL connection logs in with; refused when either is missing."""
        username, password = self.sasl_credentials()
        if not username or password is None:
            raise ConfigurationError(
                f"security.protocol={self.security_protocol} needs credentials: set sasl.username and sasl.password "
                f"(or sasl.jaas.config) in {self.origin}")
        return username, password

    def ca_file(self) -> str | None:
        if "ssl.ca.location" in self.properties:
            return self.properties["ssl.ca.location"]
        if self.properties.get("ssl.truststore.type", "").upper() == "PEM":
            return self.properties.get("ssl.truststore.location")
        return None

    def _check_hostname(self) -> bool:
        return self.properties.get("ssl.endpoint.identification.algorithm", "https").lower() not in ("", "none")

    # -- kafka-python ----------------------------------------------------------------

    def kafka_python(self, client: type[Any]) -> dict[str, Any]:
        """Keyword arguments for a kafka-python client class (KafkaConsumer, KafkaProducer, KafkaAdminClient).

        Settings the class does not know are left out (a consumer-only setting never reaches a
        producer); `bootstrap_servers` is included.
        """
        known = client.DEFAULT_CONFIG
        kwargs: dict[str, Any] = {"bootstrap_servers": self.bootstrap_servers}
        for name, value in self.properties.items():
            if name in JAVA_ONLY or name in ("ssl.endpoint.identification.algorithm",):
                continue
            argument = KAFKA_PYTHON_NAMES.get(name, name.replace(".", "_"))
            if argument in known:
                kwargs[argument] = _typed(value, known[argument])
        if self.security_protocol != "PLAINTEXT":
            kwargs["security_protocol"] = self.security_protocol
        if self.security_protocol.startswith("SASL"):
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            if self.uses_oauth:
                # Imported with the kafka-python client it serves: DAG parsing imports this module, not kafka-python.
                from airflow_exactly_once.kafka.token_provider import ClientCredentialsTokenProvider

                access_token(self.oauth_client())  # a refusing token endpoint is named here, not after a bootstrap wait
                kwargs["sasl_oauth_token_provider"] = ClientCredentialsTokenProvider(self.oauth_client(),
                                                                                     self.oauth_extensions())
            else:
                kwargs["sasl_plain_username"], kwargs["sasl_plain_password"] = self.sasl_credentials()
        if self.security_protocol.endswith("SSL"):
            if self.ca_file():
                kwargs["ssl_cafile"] = self.ca_file()
            kwargs["ssl_check_hostname"] = self._check_hostname()
        return {k: v for k, v in kwargs.items() if k in known or k == "bootstrap_servers"}

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context kafka-python builds from these settings (CA, host name check, client certificate)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = self._check_hostname()
        if self.ca_file():
            context.load_verify_locations(self.ca_file())
        else:
            context.load_default_certs()
        if "ssl.certificate.location" in self.properties:
            context.load_cert_chain(self.properties["ssl.certificate.location"],
                                    self.properties.get("ssl.key.location"), self.properties.get("ssl.key.password"))
        return context

    # -- Kafka's Java client (Spark) ---------------------------------------------------

    def java(self) -> dict[str, str]:
        """Properties for Kafka's Java client, e.g. Spark's Kafka source (prefix them with 'kafka.')."""
        props = {k: v for k, v in self.properties.items() if k not in LIBRDKAFKA_ONLY}
        props["bootstrap.servers"] = self.bootstrap_servers
        protocol = self.security_protocol
        if self.uses_oauth:
            client = self.oauth_client()
            if "sasl.jaas.config" not in props:
                scope = f' scope="{_jaas_quote(client.scope)}"' if client.scope else ""
                extensions = "".join(f' extension_{k}="{_jaas_quote(v)}"' for k, v in self.oauth_extensions().items())
                props["sasl.jaas.config"] = (f'{_OAUTH_LOGIN_MODULE} required '
                                             f'clientId="{_jaas_quote(client.client_id)}" '
                                             f'clientSecret="{_jaas_quote(client.client_secret)}"{scope}{extensions};')
            props.setdefault("sasl.login.callback.handler.class", _OAUTH_LOGIN_HANDLER)
        elif protocol.startswith("SASL") and "sasl.jaas.config" not in props:
            username, password = self.sasl_credentials()
            module = _JAAS_MODULES[self.properties.get("sasl.mechanism", "").upper()]
            props["sasl.jaas.config"] = (f'{module} required username="{_jaas_quote(username)}" '
                                         f'password="{_jaas_quote(password)}";')
        if protocol.endswith("SSL"):
            if "ssl.ca.location" in self.properties:
                props["ssl.truststore.type"] = "PEM"
                props["ssl.truststore.location"] = self.properties["ssl.ca.location"]
            if "ssl.certificate.location" in self.properties:
                # Inline PEM: executors on other machines need no copy of the files.
                props["ssl.keystore.type"] = "PEM"
                props["ssl.keystore.certificate.chain"] = _read(self.properties["ssl.certificate.location"])
                props["ssl.keystore.key"] = _read(self.properties.get("ssl.key.location",
                                                                      self.properties["ssl.certificate.location"]))
            if not self._check_hostname():
                props["ssl.endpoint.identification.algorithm"] = ""
        return props

    def spark_source_options(self) -> dict[str, str]:
        """The same, as options of Spark's Kafka source."""
        return {f"kafka.{k}": v for k, v in self.java().items()}

    # -- librdkafka (confluent-kafka) --------------------------------------------------

    def librdkafka(self) -> dict[str, str]:
        """Properties for confluent-kafka clients."""
        props = {k: v for k, v in self.properties.items() if k not in JAVA_ONLY and k not in KAFKA_PYTHON_ONLY}
        props["bootstrap.servers"] = self.bootstrap_servers
        if self.uses_oauth:
            client = self.oauth_client()
            props.update({"sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": client.client_id,
                          "sasl.oauthbearer.client.secret": client.client_secret,
                          "sasl.oauthbearer.token.endpoint.url": client.token_endpoint})
            if client.scope:
                props["sasl.oauthbearer.scope"] = client.scope
        elif self.security_protocol.startswith("SASL"):
            props["sasl.username"], props["sasl.password"] = self.sasl_login()
        ca = self.ca_file()
        if ca:
            props["ssl.ca.location"] = ca
        if self.security_protocol.endswith("SSL") and not self._check_hostname():
            props["ssl.endpoint.identification.algorithm"] = "none"
        return props

    # -- who the brokers see (kafka.access names them in what it says of a refusal) ---------

    @property
    def principal(self) -> str:
        """Who the brokers see: the SASL user, or the anonymous/certificate principal."""
        if self.uses_oauth:
            return f"OAuth client {self.principal_name()!r}"
        username = self.principal_name()
        return f"user {username!r}" if username else f"the client ({self.security_protocol})"

    def principal_name(self) -> str | None:
        """The name in the brokers' principal User:<name>: the SASL user, or an OAuth token's subject, which
        client-credentials providers commonly set to the client id (Kafka's sasl.oauthbearer.sub.claim.name)."""
        if not self.security_protocol.startswith("SASL"):
            return None
        if self.uses_oauth:
            return self.properties.get("sasl.oauthbearer.client.id") or self._jaas_options().get("clientId")
        return self.sasl_credentials()[0]

    # -- storage and transport ---------------------------------------------------------

    def secrets(self) -> dict[str, str]:
        return {k: v for k, v in self.properties.items() if k in SECRETS}


def _typed(value: str, default: Any) -> Any:
    """A string from a connection extra as the type kafka-python expects (its default's type)."""
    if isinstance(default, bool):
        return value.lower() in ("1", "true", "yes") if isinstance(value, str) else bool(value)
    if isinstance(default, int) and not isinstance(default, bool):
        try:
            return int(value)
        except (TypeError, ValueError):
            return value
    if isinstance(default, float):
        try:
            return float(value)
        except (TypeError, ValueError):
            return value
    return value


def _jaas_quote(value: str | None) -> str:
    return (value or "").replace("\\", "\\\\").replace('"', '\\"')


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the PEM file {path} named in the Kafka settings: {exc}") from exc
