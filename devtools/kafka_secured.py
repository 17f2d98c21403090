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

`grant` adds ACLs (as ADMIN); `connection_extra` is the `kafka` connection extra a user logs in
with, in the librdkafka names the official provider uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.kafka_broker import LocalKafkaBroker
from devtools.tls import CertificateFiles, make_ca, make_server_certificate

ADMIN = "admin"
MECHANISM = "SCRAM-SHA-512"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


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
    """A LocalKafkaBroker whose only client listener is SASL_SSL (SCRAM-SHA-512), with ACLs enforced."""

    def __init__(self, data_dir: str | Path, users: dict[str, str], admin_password: str = "admin-secret",
                 **kwargs: Any) -> None:
        super().__init__(data_dir, **kwargs)
        self.users = dict(users)
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

    def client_config(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.bootstrap_servers, "security_protocol": "SASL_SSL",
                "sasl_mechanism": MECHANISM, "sasl_plain_username": ADMIN,
                "sasl_plain_password": self.admin_password, "ssl_cafile": str(self.ca_file)}

    def _password(self, user: str) -> str:
        return self.admin_password if user == ADMIN else self.users[user]

    def _listener_config(self) -> dict[str, str]:
        jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN}" '
                f'password="{self.admin_password}";')
        return {
            "listeners": f"SASL_SSL://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"SASL_SSL://127.0.0.1:{self.port}",
            "inter.broker.listener.name": "SASL_SSL",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "authorizer.class.name": AUTHORIZER,
            "super.users": f"User:{ADMIN};User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
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
