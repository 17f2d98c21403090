"""A secured single-node broker: SASL_SSL with SCRAM-SHA-512 over TLS, SCRAM users and ACLs.

What platform clusters look like, on 127.0.0.1, for the tests that prove the official `kafka`
connection's security settings reach every client (tests/integration/test_kafka_security.py,
tests/system/test_pipeline_secured.py):

* TLS: a CA and a broker certificate (SANs 127.0.0.1 and localhost) made at start-up
  (devtools.tls); the broker reads them as PEM key and trust stores.
* SASL: SCRAM-SHA-512 users created when the storage is formatted (`kafka-storage format
  --add-scram`), so they exist before the broker serves its first request.
* Authorization: KRaft's StandardAuthorizer, no access without an ACL. The broker logs in to
  itself (inter-broker traffic: transaction markers) as the super user ADMIN; the controller
  listener is PLAINTEXT on loopback, whose principal (ANONYMOUS) is a super user too, because
  KRaft controllers cannot take SCRAM logins before the metadata holding the users is loaded.
  Clients only ever see the SASL_SSL listener.

* OAuth (with `oauth_clients`): a second client listener, SASL_PLAINTEXT with OAUTHBEARER, whose
  tokens Kafka's own OAuthBearerValidatorCallbackHandler verifies against the JWKS of a
  devtools.oauth_provider started with the broker (issuer and audience checked too). An OAuth
  client's principal is User:<client id> (the token's sub), under the same ACLs. One broker
  serves both logins, so the OAuth tests add no broker start to a session.

`grant` adds ACLs (as ADMIN); `connection_extra` is the `kafka` connection extra a user logs in
with, in the librdkafka names the official provider uses; `oauth_connection_extra` the one an
OAuth client logs in with (OIDC client credentials).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.kafka_broker import LocalKafkaBroker
from devtools.oauth_provider import AUDIENCE, LocalOAuthProvider
from devtools.ports import reserve_port
from devtools.tls import CertificateFiles, make_ca, make_server_certificate

ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
OAUTH_LISTENER = "OAUTH"
_OAUTH_VALIDATOR = "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"
_OAUTH_LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
# Kafka 3.9.1+ fetches OAuth URLs only when this JVM property lists them (from 4.0 it lists none by default).
_ALLOWED_URLS = "org.apache.kafka.sasl.oauthbearer.allowed.urls"


@dataclass(frozen=True)
class Grant:
    """One ALLOW ACL: `operation` (READ, WRITE, DESCRIBE, ...) on a resource of `resource_type`
    (TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID) named `name`, literally or as a prefix."""

    user: str
    operation: str
    resource_type: str
    name: str = "kafka-cluster"
    prefixed: bool = False


def pipeline_grants(user: str, input_prefix: str, output_prefix: str, transactional_id_prefix: str,
                    without: tuple[str, ...] = ()) -> list[Grant]:
    """The ACLs an exactly-once pipeline needs, by prefix, minus the kinds named in `without`
    ("input", "output", "transactional_id", "cluster"): what a platform team grants one pipeline user.

    input: READ and DESCRIBE its topics (planning lists offsets, Spark fetches); output: WRITE
    and DESCRIBE the sink topic; transactional_id: WRITE and DESCRIBE its transactional ids
    (InitProducerId, EndTxn, describing a batch's transactions); cluster: DESCRIBE_CONFIGS (the
    sink reads the brokers' transaction.max.timeout.ms at plan time) and IDEMPOTENT_WRITE.
    """
    kinds = {
        "input": [("READ", "TOPIC", input_prefix), ("DESCRIBE", "TOPIC", input_prefix)],
        "output": [("WRITE", "TOPIC", output_prefix), ("DESCRIBE", "TOPIC", output_prefix)],
        "transactional_id": [("WRITE", "TRANSACTIONAL_ID", transactional_id_prefix),
                             ("DESCRIBE", "TRANSACTIONAL_ID", transactional_id_prefix)],
        "cluster": [("DESCRIBE_CONFIGS", "CLUSTER", "kafka-cluster"), ("IDEMPOTENT_WRITE", "CLUSTER", "kafka-cluster")],
    }
    unknown = set(without) - set(kinds)
    if unknown:
        raise ValueError(f"unknown ACL kinds {sorted(unknown)}; known: {sorted(kinds)}")
    return [Grant(user, op, rtype, name, prefixed=rtype != "CLUSTER")
            for kind, rows in kinds.items() if kind not in without for op, rtype, name in rows]


class SecuredKafkaBroker(LocalKafkaBroker):
    """A LocalKafkaBroker whose client listener is SASL_SSL (SCRAM-SHA-512), with ACLs enforced; with
    `oauth_clients` (client id -> secret) also a SASL_PLAINTEXT OAUTHBEARER listener and its token endpoint."""

    def __init__(self, data_dir: str | Path, users: dict[str, str], admin_password: str = "admin-secret",
                 oauth_clients: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(data_dir, **kwargs)
        self.users = dict(users)
        self.oauth = LocalOAuthProvider(oauth_clients) if oauth_clients else None
        self.oauth_port = reserve_port() if oauth_clients else 0
        self.admin_password = admin_password
        tls = self.data_dir / "tls"
        if not (tls / "ca.pem").exists():  # a restart keeps its certificates
            make_server_certificate(make_ca(tls), tls)
        self.ca = CertificateFiles(tls / "ca.pem", tls / "ca-key.pem")
        self.keystore = CertificateFiles(tls / "broker.pem", tls / "broker-key.pem").bundle(tls / "keystore.pem")

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients must trust (ssl.ca.location)."""
        return self.ca.certificate

    def connection_extra(self, user: str, password: str | None = None, **overrides: Any) -> dict[str, Any]:
        """The official `kafka` connection's extra for `user` (librdkafka names)."""
        return {"bootstrap.servers": self.bootstrap_servers, "security.protocol": "SASL_SSL",
                "sasl.mechanism": MECHANISM, "sasl.username": user,
                "sasl.password": self._password(user) if password is None else password,
                "ssl.ca.location": str(self.ca_file), **overrides}

    @property
    def oauth_bootstrap_servers(self) -> str:
        """The OAUTHBEARER listener (SASL_PLAINTEXT)."""
        self._oauth()
        return f"127.0.0.1:{self.oauth_port}"

    def oauth_connection_extra(self, client_id: str, client_secret: str | None = None,
                               **overrides: Any) -> dict[str, Any]:
        """The official `kafka` connection's extra for OAuth client `client_id`: OIDC client credentials."""
        provider = self._oauth()
        return {"bootstrap.servers": self.oauth_bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
                "sasl.oauthbearer.client.id": client_id,
                "sasl.oauthbearer.client.secret": (provider.clients[client_id] if client_secret is None
                                                   else client_secret),
                "sasl.oauthbearer.token.endpoint.url": provider.token_url, "sasl.oauthbearer.scope": "kafka",
                **overrides}

    def _oauth(self) -> LocalOAuthProvider:
        if self.oauth is None:
            raise RuntimeError("this broker has no OAuth listener: start it with oauth_clients={client id: secret}")
        return self.oauth

    def start(self, timeout: float = 90.0) -> "SecuredKafkaBroker":
        if self.oauth is not None:
            self.oauth.start()  # the broker fetches the JWKS when its OAuth listener starts
        super().start(timeout)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        super().stop(timeout)
        if self.oauth is not None:
            self.oauth.stop()

    def _java(self, main_class: str, *args: str, **popen):
        if self.oauth is not None:
            allowed = f"-D{_ALLOWED_URLS}={self.oauth.jwks_url},{self.oauth.token_url}"
            tool_options = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {allowed}".strip()
            popen["env"] = {**popen.get("env", os.environ), "JAVA_TOOL_OPTIONS": tool_options}
        return super()._java(main_class, *args, **popen)

    def client_config(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.bootstrap_servers, "security_protocol": "SASL_SSL",
                "sasl_mechanism": MECHANISM, "sasl_plain_username": ADMIN,
                "sasl_plain_password": self.admin_password, "ssl_cafile": str(self.ca_file)}

    def _password(self, user: str) -> str:
        return self.admin_password if user == ADMIN else self.users[user]

    def _listener_config(self) -> dict[str, str]:
        jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN}" '
                f'password="{self.admin_password}";')
        oauth = f",{OAUTH_LISTENER}://127.0.0.1:{self.oauth_port}" if self.oauth is not None else ""
        return {
            "listeners": f"SASL_SSL://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}{oauth}",
            "advertised.listeners": f"SASL_SSL://127.0.0.1:{self.port}{oauth}",
            "inter.broker.listener.name": "SASL_SSL",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT"
                                              + (f",{OAUTH_LISTENER}:SASL_PLAINTEXT" if oauth else ""),
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            **self._oauth_listener_config(),
            "authorizer.class.name": AUTHORIZER,
            "super.users": f"User:{ADMIN};User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
        }

    def _oauth_listener_config(self) -> dict[str, str]:
        """The OAUTHBEARER listener's settings: tokens verified with the provider's JWKS, issuer and audience."""
        if self.oauth is None:
            return {}
        name = OAUTH_LISTENER.lower()
        return {
            f"listener.name.{name}.sasl.enabled.mechanisms": "OAUTHBEARER",
            f"listener.name.{name}.oauthbearer.sasl.jaas.config": f"{_OAUTH_LOGIN_MODULE} required;",
            f"listener.name.{name}.oauthbearer.sasl.server.callback.handler.class": _OAUTH_VALIDATOR,
            "sasl.oauthbearer.jwks.endpoint.url": self.oauth.jwks_url,
            "sasl.oauthbearer.expected.issuer": self.oauth.issuer,
            "sasl.oauthbearer.expected.audience": AUDIENCE,
        }

    def _format_arguments(self) -> list[str]:
        arguments = []
        for user, password in {ADMIN: self.admin_password, **self.users}.items():
            arguments += ["--add-scram", f"{MECHANISM}=[name={user},password={password}]"]
        return arguments

    def grant(self, grants: list[Grant]) -> None:
        """Create ALLOW ACLs, as the super user; fails if the broker refuses any."""
        from kafka import KafkaAdminClient
        from kafka.admin import ACL, ACLOperation, ACLPermissionType, ACLResourcePatternType, ResourcePattern
        from kafka.admin import ResourceType

        acls = [ACL(f"User:{g.user}", "*", ACLOperation[g.operation], ACLPermissionType.ALLOW,
                    ResourcePattern(ResourceType[g.resource_type], g.name,
                                    ACLResourcePatternType.PREFIXED if g.prefixed else ACLResourcePatternType.LITERAL))
                for g in grants]
        admin = KafkaAdminClient(**self.client_config())
        try:
            result = admin.create_acls(acls)
        finally:
            admin.close()
        if result.get("failed"):
            raise RuntimeError(f"the broker refused ACLs: {result['failed']}")
