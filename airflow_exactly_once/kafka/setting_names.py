"""The names of the `kafka` connection's settings: one spelling for each, which client knows which, which are
secrets and which are refused.

A setting may be given in librdkafka's spelling (the official provider's, and Java's client's) or in
kafka-python's; `canonical_name` reads either as one name. kafka.settings translates the settings for each
client by these tables: a client is never handed a name it does not know. Kept apart from the translation
because they are what a check needs without any client (which keys of a spec are secrets: `secret_keys`), and
what docs/connections.md's table of translations is held against.
"""

from __future__ import annotations

from typing import Any, Mapping

# What would let a client move offsets or read uncommitted records: the ledger owns offsets.
FORBIDDEN = ("enable.auto.commit", "group.id", "isolation.level", "auto.offset.reset")
SECRETS = ("sasl.password", "sasl.jaas.config", "ssl.key.password", "ssl.keystore.password",
           "ssl.truststore.password", "ssl.keystore.key", "sasl.oauthbearer.client.secret")

# librdkafka's OIDC client settings; Java's client takes the client's id, secret and scope as JAAS options.
_OIDC_SETTINGS = ("sasl.oauthbearer.method", "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.secret",
                  "sasl.oauthbearer.scope", "sasl.oauthbearer.extensions")
# kafka-python's names of settings whose librdkafka/Java name is not just dots for underscores.
KAFKA_PYTHON_NAMES = {
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.crl.location": "ssl_crlfile",
}
_CANONICAL_OF_KAFKA_PYTHON = {v: k for k, v in KAFKA_PYTHON_NAMES.items()}
_ALIASES = {"sasl.mechanisms": "sasl.mechanism", "metadata.broker.list": "bootstrap.servers"}
# kafka-python-only properties: neither librdkafka nor Java's client knows them (confluent-kafka refuses them).
KAFKA_PYTHON_ONLY = ("bootstrap.timeout.ms",)
# librdkafka properties that Java's client spells differently (translated in KafkaSettings.java()).
LIBRDKAFKA_ONLY = ("sasl.username", "sasl.password", "ssl.ca.location", "ssl.certificate.location",
                   "ssl.key.location", "ssl.crl.location", "enable.ssl.certificate.verification",
                   "socket.timeout.ms", *_OIDC_SETTINGS, *KAFKA_PYTHON_ONLY)
# Java-only properties (they have a librdkafka spelling, translated in KafkaSettings.librdkafka()).
JAVA_ONLY = ("sasl.jaas.config", "sasl.login.callback.handler.class", "ssl.truststore.location",
             "ssl.truststore.type", "ssl.truststore.password",
             "ssl.keystore.location", "ssl.keystore.type", "ssl.keystore.password",
             "ssl.keystore.certificate.chain", "ssl.keystore.key", "ssl.truststore.certificates")


def canonical_name(key: str) -> str:
    """The librdkafka/Java spelling of a setting given either way ('security_protocol' -> 'security.protocol')."""
    key = str(key).strip()
    if "." not in key:
        key = _CANONICAL_OF_KAFKA_PYTHON.get(key, key.replace("_", "."))
    return _ALIASES.get(key, key)


def secret_keys(settings: Mapping[str, Any] | None) -> list[str]:
    """The keys of a settings dict (in either spelling) whose values are secrets."""
    return [k for k in (settings or {}) if canonical_name(k) in SECRETS]
