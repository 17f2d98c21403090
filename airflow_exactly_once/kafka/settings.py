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

The settings also explain failures: `explain()` reads what any of the three clients said
(a wrong password, an untrusted certificate, a missing ACL) and names the setting or grant to
change and where the settings came from (`origin`, e.g. "connection 'kafka_secured'");
kafka.access finds out actively when a client only says it could not connect.
"""

from __future__ import annotations

import hashlib
import json
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.kafka.oauth import ClientCredentials, access_token

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
OAUTHBEARER = "OAUTHBEARER"
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", OAUTHBEARER)
# What would let a client move offsets or read uncommitted records: the ledger owns offsets.
FORBIDDEN = ("enable.auto.commit", "group.id", "isolation.level", "auto.offset.reset")
SECRETS = ("sasl.password", "sasl.jaas.config", "ssl.key.password", "ssl.keystore.password",
           "ssl.truststore.password", "ssl.keystore.key", "sasl.oauthbearer.client.secret")

# librdkafka's OIDC client settings; Java's client takes the client's id, secret and scope as JAAS options.
_OIDC_SETTINGS = ("sasl.oauthbearer.method", "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret",
                  "sasl.oauthbearer.scope", "sasl.oauthbearer.extensions")
# Java's client: the login module and the handler that fetches client-credentials tokens (Kafka clients 3.4 and
# later, 4.x included; the `.secured.` package name of 3.1-3.3 is deprecated in 3.x and gone in 4.0).
_OAUTH_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
_OAUTH_LOGIN_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
# The JVM system property of Kafka clients 3.9.1+ listing the URLs a client may fetch tokens from; from 4.0 on it
# lists none unless set, so a Spark whose Kafka client is 4.x needs it in its driver's and executors' JVM options.
OAUTH_ALLOWED_URLS_PROPERTY = "org.apache.kafka.sasl.oauthbearer.allowed.urls"
# kafka-python's names of settings whose librdkafka/Java name is not just dots for underscores.
_KAFKA_PYTHON_NAMES = {
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.crl.location": "ssl_crlfile",
}
_CANONICAL_OF_KAFKA_PYTHON = {v: k for k, v in _KAFKA_PYTHON_NAMES.items()}
_ALIASES = {"sasl.mechanisms": "sasl.mechanism", "metadata.broker.list": "bootstrap.servers"}
# kafka-python-only properties: neither librdkafka nor Java's client knows them (confluent-kafka refuses them).
_KAFKA_PYTHON_ONLY = ("bootstrap.timeout.ms",)
# librdkafka properties that Java's client spells differently (translated in java()).
_LIBRDKAFKA_ONLY = ("sasl.username", "sasl.password", "ssl.ca.location", "ssl.certificate.location",
                    "ssl.key.location", "ssl.crl.location", "enable.ssl.certificate.verification",
                    "socket.timeout.ms", *_OIDC_SETTINGS, *_KAFKA_PYTHON_ONLY)
# Java-only properties (they have a librdkafka spelling, translated in librdkafka()).
_JAVA_ONLY = ("sasl.jaas.config", "sasl.login.callback.handler.class", "ssl.truststore.location",
              "ssl.truststore.type", "ssl.truststore.password",
              "ssl.keystore.location", "ssl.keystore.type", "ssl.keystore.password",
              "ssl.keystore.certificate.chain", "ssl.keystore.key", "ssl.truststore.certificates")
# How kafka-python, Java's client and librdkafka word each problem (matched in their error text).
_TOKEN_NOT_FETCHED = ("token endpoint", "Failed to acquire SASL OAUTHBEARER token", "OAUTHBEARER token")
_TOKEN_URL_NOT_ALLOWED = ("oauthbearer.allowed.urls",)
_LOGIN_REFUSED = ("SaslAuthenticationFailed", "SaslAuthenticationException", "SASL authentication error",
                  "Authentication failed during authentication", "invalid credentials")
_HOST_NOT_IN_CERTIFICATE = ("Hostname mismatch", "IP address mismatch", "No subject alternative",
                            "No name matching", "doesn't match any of the subject alternative")
_UNTRUSTED_CERTIFICATE = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "PKIX path building failed",
                          "unable to find valid certification path")
_DENIED = {  # the broker's authorizer said no, by resource (kafka-python and Java; then librdkafka's names)
    "transactional_id": ("TransactionalIdAuthorization", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"),
    "topic": ("TopicAuthorization", "Not authorized to access topics", "TOPIC_AUTHORIZATION_FAILED"),
    "group": ("GroupAuthorization", "Not authorized to access group", "GROUP_AUTHORIZATION_FAILED"),
    "cluster": ("ClusterAuthorization", "Cluster authorization failed", "CLUSTER_AUTHORIZATION_FAILED"),
}
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def canonical_name(key: str) -> str:
    """The librdkafka/Java spelling of a setting given either way ('security_protocol' -> 'security.protocol')."""
    key = str(key).strip()
    if "." not in key:
        key = _CANONICAL_OF_KAFKA_PYTHON.get(key, key.replace("_", "."))
    return _ALIASES.get(key, key)


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

    def _ca_file(self) -> str | None:
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
            if name in _JAVA_ONLY or name in ("ssl.endpoint.identification.algorithm",):
                continue
            argument = _KAFKA_PYTHON_NAMES.get(name, name.replace(".", "_"))
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
            if self._ca_file():
                kwargs["ssl_cafile"] = self._ca_file()
            kwargs["ssl_check_hostname"] = self._check_hostname()
        return {k: v for k, v in kwargs.items() if k in known or k == "bootstrap_servers"}

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context kafka-python builds from these settings (CA, host name check, client certificate)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = self._check_hostname()
        if self._ca_file():
            context.load_verify_locations(self._ca_file())
        else:
            context.load_default_certs()
        if "ssl.certificate.location" in self.properties:
            context.load_cert_chain(self.properties["ssl.certificate.location"],
                                    self.properties.get("ssl.key.location"), self.properties.get("ssl.key.password"))
        return context

    # -- Kafka's Java client (Spark) ---------------------------------------------------

    def java(self) -> dict[str, str]:
        """Properties for Kafka's Java client, e.g. Spark's Kafka source (prefix them with 'kafka.')."""
        props = {k: v for k, v in self.properties.items() if k not in _LIBRDKAFKA_ONLY}
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

    def reader_group(self, pipeline_id: str) -> str:
        """The group id of a pipeline's reads in Spark (which assigns partitions: it never joins or commits).

        Spark's executors pool their consumers by group id and partition, and name a batch read's group anew
        each time: with one id per pipeline a warm executor's consumer reads the next batch too (a
        consumer less to open per small write: docs/benchmarks.md). The digest of the connection's settings
        (servers, security, user; never a secret) keeps a consumer of the old cluster or user from serving a
        pipeline whose connection changed.
        """
        shown = {k: v for k, v in self.java().items() if k not in SECRETS}
        if self.uses_oauth:
            shown["sasl.oauthbearer.client.id"] = self.oauth_client().client_id
        elif self.security_protocol.startswith("SASL"):
            shown["sasl.username"] = self.sasl_login()[0]
        digest = hashlib.sha256(json.dumps(shown, sort_keys=True).encode()).hexdigest()[:12]
        return f"airflow-exactly-once-{pipeline_id}-{digest}"

    # -- librdkafka (confluent-kafka) --------------------------------------------------

    def librdkafka(self) -> dict[str, str]:
        """Properties for confluent-kafka clients."""
        props = {k: v for k, v in self.properties.items() if k not in _JAVA_ONLY and k not in _KAFKA_PYTHON_ONLY}
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
        ca = self._ca_file()
        if ca:
            props["ssl.ca.location"] = ca
        if self.security_protocol.endswith("SSL") and not self._check_hostname():
            props["ssl.endpoint.identification.algorithm"] = "none"
        return props

    # -- what a client's failure says about these settings -------------------------------

    @property
    def principal(self) -> str:
        """Who the brokers see: the SASL user, or the anonymous/certificate principal."""
        if self.uses_oauth:
            return f"OAuth client {self._principal_name()!r}"
        username = self._principal_name()
        return f"user {username!r}" if username else f"the client ({self.security_protocol})"

    def _principal_name(self) -> str | None:
        """The name in the brokers' principal User:<name>: the SASL user, or an OAuth token's subject, which
        client-credentials providers commonly set to the client id (Kafka's sasl.oauthbearer.sub.claim.name)."""
        if not self.security_protocol.startswith("SASL"):
            return None
        if self.uses_oauth:
            return self.properties.get("sasl.oauthbearer.client.id") or self._jaas_options().get("clientId")
        return self.sasl_credentials()[0]

    def explain(self, failure: BaseException | str, *, topics: tuple[str, ...] | list[str] = (),
                topic_operations: str = "READ and DESCRIBE", transactional_id: str | None = None,
                transactional_id_prefix: str | None = None, topic_pattern: str | None = None
                ) -> ConfigurationError | None:
        """A ConfigurationError naming the setting or ACL to change when `failure` (an exception or its
        text, from any client) is a refused login, an untrusted certificate or a denied operation;
        None for anything else. `topics` and the rest say what the failed step was doing; `topic_pattern`
        names the topics when the step knows only the pipeline's pattern.
        """
        text = f"{type(failure).__name__}: {failure}" if isinstance(failure, BaseException) else str(failure)
        servers = self.bootstrap_servers
        said = _said(text, _TOKEN_URL_NOT_ALLOWED)
        if said and self.uses_oauth:
            url = self.properties.get("sasl.oauthbearer.token.endpoint.url", "<token endpoint>")
            return ConfigurationError(
                f"Kafka's Java client (4.0 and later) may only fetch tokens from URLs its JVM allows: add "
                f"-D{OAUTH_ALLOWED_URLS_PROPERTY}={url} to spark.driver.extraJavaOptions and "
                "spark.executor.extraJavaOptions (for Spark Connect: the server's). The client said: " + said)
        said = _said(text, _TOKEN_NOT_FETCHED)
        if said and self.uses_oauth:
            client = self.oauth_client()
            return ConfigurationError(
                f"a Kafka client could not get an OAuth token for client {client.client_id!r} from the token endpoint "
                f"{client.token_endpoint} (sasl.oauthbearer.token.endpoint.url of {self.origin}): fix "
                "sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret, or the URL if the endpoint cannot be "
                f"reached from the Spark executors; retrying with the same settings cannot succeed. The client said: "
                f"{said}")
        said = _said(text, _LOGIN_REFUSED)
        if said and self.uses_oauth:
            return ConfigurationError(
                f"the Kafka brokers at {servers} refused the OAuth token of {self.principal} from "
                f"{self.properties.get('sasl.oauthbearer.token.endpoint.url')}: the brokers must trust the token's "
                "issuer and signing keys (their sasl.oauthbearer.jwks.endpoint.url) and accept its audience "
                f"(sasl.oauthbearer.expected.audience); check sasl.oauthbearer.client.id, the scope and the token "
                f"endpoint in {self.origin}; retrying with the same settings cannot succeed. The client said: {said}")
        if said:
            mechanism = self.properties.get("sasl.mechanism", "").upper() or "?"
            return ConfigurationError(
                f"the Kafka brokers at {servers} refused the SASL login of {self.principal} "
                f"(sasl.mechanism={mechanism}): fix sasl.username and sasl.password (or sasl.jaas.config) in "
                f"{self.origin}; retrying with the same credentials cannot succeed. The client said: {said}")
        said = _said(text, _HOST_NOT_IN_CERTIFICATE)
        if said:
            return ConfigurationError(
                f"the TLS certificate of the Kafka brokers at {servers} is not issued for the host names in "
                f"bootstrap.servers ({self.origin}): connect with a name the certificate lists, or (only for tests) "
                f"set ssl.endpoint.identification.algorithm=none in {self.origin}. The client said: {said}")
        said = _said(text, _UNTRUSTED_CERTIFICATE)
        if said:
            return ConfigurationError(
                f"the TLS certificate of the Kafka brokers at {servers} is not signed by a CA the client trusts "
                f"(ssl.ca.location={self._ca_file() or 'unset: the system CAs'} in {self.origin}): set "
                f"ssl.ca.location to the PEM file of the CA that signed the brokers' certificates. The client said: "
                f"{said}")
        for resource, words in _DENIED.items():
            said = _said(text, words)
            if said:
                denied = self._denied(resource, tuple(topics), topic_operations, transactional_id,
                                      transactional_id_prefix, topic_pattern)
                return ConfigurationError(f"{denied}. The client said: {said}")
        return None

    def _denied(self, resource: str, topics, topic_operations: str, transactional_id: str | None,
                prefix: str | None, topic_pattern: str | None = None) -> str:
        who = f"{self.principal} of {self.origin}"
        principal = f"User:{self._principal_name()}" if self._principal_name() else "<the client's principal>"
        if resource == "transactional_id":
            name = prefix or transactional_id or "<transactional id prefix>"
            what = f"transactional id {transactional_id!r}" if transactional_id else "its transactional ids"
            return (f"the Kafka brokers at {self.bootstrap_servers} do not let {who} use {what}: grant WRITE and "
                    f"DESCRIBE on the transactional ids with prefix {name!r} (kafka-acls --add --allow-principal "
                    f"{principal} --operation Write --operation Describe --transactional-id {name} "
                    "--resource-pattern-type prefixed), or connect as a user that has them")
        if resource == "topic":
            operations = " ".join(f"--operation {op.capitalize()}" for op in topic_operations.split(" and "))
            if not topics and topic_pattern:  # Kafka's ACLs name topics literally or by prefix, never by pattern
                return (f"the Kafka brokers at {self.bootstrap_servers} do not let {who} {topic_operations} the "
                        f"topics matching topic_pattern {topic_pattern!r}: grant {topic_operations} on each of them "
                        f"(kafka-acls --add --allow-principal {principal} {operations} --topic <each matching topic>, "
                        "or --topic <their common prefix> --resource-pattern-type prefixed), or connect as a user "
                        "that has them")
            named = ", ".join(topics) if topics else "<topic>"
            return (f"the Kafka brokers at {self.bootstrap_servers} do not let {who} {topic_operations} topic(s) "
                    f"{named}: grant {topic_operations} on them (kafka-acls --add --allow-principal {principal} "
                    f"{operations} --topic {topics[0] if topics else '<topic>'}), or connect as a user that has them")
        if resource == "group":
            return (f"the Kafka brokers at {self.bootstrap_servers} do not let {who} use a consumer group: grant READ "
                    "on the group (kafka-acls --add --allow-principal "
                    f"{principal} --operation Read --group <group>)")
        return (f"the Kafka brokers at {self.bootstrap_servers} refuse {who} a cluster operation: grant DESCRIBE_CONFIGS "
                "(the Kafka sink reads transaction.max.timeout.ms) and IDEMPOTENT_WRITE on the cluster "
                f"(kafka-acls --add --allow-principal {principal} --operation DescribeConfigs --operation "
                "IdempotentWrite --cluster)")

    # -- storage and transport ---------------------------------------------------------

    def secrets(self) -> dict[str, str]:
        return {k: v for k, v in self.properties.items() if k in SECRETS}


def _said(text: str, words: tuple[str, ...]) -> str | None:
    """The client's line that says one of `words` (case-insensitive), shortened; None when none does."""
    for line in text.splitlines():
        lowered = line.lower()
        if any(word.lower() in lowered for word in words):
            line = line.strip(" \t:")
            return line if len(line) <= 300 else line[:300] + "..."
    return None


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


def secret_keys(settings: Mapping[str, Any] | None) -> list[str]:
    """The keys of a settings dict (in either spelling) whose values are secrets."""
    return [k for k in (settings or {}) if canonical_name(k) in SECRETS]
