"""Why a Kafka client could not get in: from what it said, or found out actively and quickly.

A refused client says why in its own words, each client in its own (kafka-python, Java's client in
Spark, librdkafka): `explain_refusal` reads them (a refused login or token, an untrusted certificate,
a denied operation) and names the setting or grant to change and where the settings came from
(`origin`, e.g. "connection 'kafka_secured'").

kafka-python reports a refused login, an untrusted certificate and a stopped broker alike:
after its bootstrap timeout, "Unable to bootstrap" (the broker's SASL error response arrives
together with the closed connection, and kafka-python drops both). So when a client only says
it could not connect, `diagnose` asks the servers itself, within a few seconds:

1. TCP: does anything listen at the bootstrap servers, and answer? Each is tried until one answers (refused,
   unreachable, or accepted and silent as a paused node is: a retry may help; the error names every server that
   did not answer)
2. TLS, when security.protocol is SSL or SASL_SSL: does the handshake pass with the settings'
   CA, host name check and client certificate? A plaintext port answers a TLS handshake with
   garbage or silence; for PLAINTEXT settings, a TLS port closes the connection on a Kafka request.
   A connection closed without a byte is no proof of a wrong security.protocol, though: a node that
   died behind a proxy or load balancer (Docker's port mapping, a Kubernetes service) is accepted and
   closed the same way. So such a server counts as not reached while another server answers; only when
   every server that accepted closed does the diagnosis blame the settings.
3. SASL, when security.protocol is SASL_*: one login with librdkafka (confluent-kafka, installed
   with the official Kafka provider), which reports the broker's answer faithfully.

Settings problems come back as the ConfigurationError of explain_refusal (never worth a
retry); a server that cannot be reached is a detail for the caller's retriable error.
"""

from __future__ import annotations

import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any, Callable

from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError
from airflow_exactly_once.kafka.liveness import NoAnswer, api_versions_answered, host_and_port
from airflow_exactly_once.kafka.settings import KafkaSettings

DIAGNOSIS_TIMEOUT_S = 5.0
# How long planning and the Kafka sink's probes wait for a first broker (unless bootstrap.timeout.ms
# is set) before diagnosing: kafka-python's own default is 30 s.
PROBE_BOOTSTRAP_TIMEOUT_MS = 10_000
# The JVM system property of Kafka clients 3.9.1+ listing the URLs a client may fetch tokens from; from 4.0 on it
# lists none unless set, so a Spark whose Kafka client is 4.x needs it in its driver's and executors' JVM options.
OAUTH_ALLOWED_URLS_PROPERTY = "org.apache.kafka.sasl.oauthbearer.allowed.urls"
# How kafka-python, Java's client and librdkafka word each refusal (matched in their error text).
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
# What clients say when they found no broker to talk to (kafka-python, Java's client, librdkafka).
_NO_CONNECTION = ("Unable to bootstrap", "NoBrokersAvailable", "KafkaConnectionError", "Cannot connect to Kafka",
                  "TimeoutException", "Timed out waiting", "Broker transport failure", "Connection refused",
                  "TransactionCoordinatorUnavailable", "KafkaTimeoutError")
# What clients say when a partition has fewer in-sync replicas than min.insync.replicas (librdkafka, Java, kafka-python).
_TOO_FEW_REPLICAS = ("NOT_ENOUGH_REPLICAS", "Not enough in-sync replicas", "NotEnoughReplicas")
# A plaintext listener answers a TLS ClientHello with a Kafka-framed reply or closes the connection.
_NOT_TLS = ("WRONG_VERSION_NUMBER", "record layer", "PACKET_LENGTH")
# ... or closes it without a byte, as a dead node behind a proxy does too.
_CLOSED = ("UNEXPECTED_EOF", "EOF occurred")
_LIBRDKAFKA_KEYS = ("bootstrap.servers", "security.protocol", "client.id")


@dataclass(frozen=True)
class Diagnosis:
    """What the servers said: a settings problem (`error`), or how they could (not) be reached (`detail`).

    `not_reached`: the servers that did not answer, each with what happened, while `reachable` says that
    another one did (a node of the cluster down: a retry goes through the others)."""

    error: ConfigurationError | None
    detail: str
    reachable: bool = True
    not_reached: tuple[str, ...] = ()


class _Silent(Exception):
    """A server accepted the connection and never answered: its process is paused or hung."""


class _ClosedWithoutAnswer(Exception):
    """A server accepted the connection and closed it without a byte: a listener of another protocol, or a dead
    node behind a proxy; only the other servers can tell which."""


def is_connection_failure(failure: BaseException | str) -> bool:
    text = f"{type(failure).__name__}: {failure}" if isinstance(failure, BaseException) else str(failure)
    return any(word.lower() in text.lower() for word in _NO_CONNECTION)


def explain_failure(settings: KafkaSettings, failure: BaseException | str, doing: str,
                    unavailable: Callable[[str], ExactlyOnceError], **context) -> ExactlyOnceError:
    """The error to raise for a Kafka client's `failure` while `doing` something.

    A settings problem (from the failure's own words, or found by `diagnose` when the client only
    said it could not connect) is a ConfigurationError; anything else is `unavailable(message)`,
    the caller's retriable error. `context` goes to explain_refusal (topics, transactional ids).
    """
    explained = explain_refusal(settings, failure, **context)
    if explained is not None:
        return explained
    text = f"{type(failure).__name__}: {failure}" if isinstance(failure, BaseException) else str(failure)
    if any(word.lower() in text.lower() for word in _TOO_FEW_REPLICAS):
        return unavailable(f"{doing} failed: Kafka refuses writes to a partition while fewer of its replicas are in "
                           "sync than the topic's min.insync.replicas (more nodes are away than the cluster was "
                           "built to lose): bring the nodes back; nothing was committed, and the task's retry "
                           f"writes again. The client said: {text[:500]}")
    if is_connection_failure(failure):
        diagnosis = diagnose(settings)
        if diagnosis.error is not None:
            return diagnosis.error
        if not diagnosis.reachable:
            return unavailable(f"{doing} failed: no Kafka broker answered at {settings.bootstrap_servers!r} "
                               f"({diagnosis.detail}): check that the brokers run and that the servers of "
                               f"{settings.origin} are right. The client said: {text[:500]}")
        if diagnosis.not_reached:  # a node is down: neither the settings nor an ACL is to blame
            return unavailable(f"{doing} failed: {diagnosis.detail}. The client said: {text[:500]}")
        return unavailable(f"{doing} failed although {diagnosis.detail}; the client said: {text[:500]}")
    return unavailable(f"{doing} failed: {text[:800]}")


def explain_refusal(settings: KafkaSettings, failure: BaseException | str, *,
                    topics: tuple[str, ...] | list[str] = (), topic_operations: str = "READ and DESCRIBE",
                    transactional_id: str | None = None, transactional_id_prefix: str | None = None,
                    topic_pattern: str | None = None) -> ConfigurationError | None:
    """A ConfigurationError naming the setting or ACL to change when `failure` (an exception or its
    text, from any client) is a refused login, an untrusted certificate or a denied operation;
    None for anything else. `topics` and the rest say what the failed step was doing; `topic_pattern`
    names the topics when the step knows only the pipeline's pattern.
    """
    text = f"{type(failure).__name__}: {failure}" if isinstance(failure, BaseException) else str(failure)
    servers = settings.bootstrap_servers
    said = _said(text, _TOKEN_URL_NOT_ALLOWED)
    if said and settings.uses_oauth:
        url = settings.properties.get("sasl.oauthbearer.token.endpoint.url", "<token endpoint>")
        return ConfigurationError(
            f"Kafka's Java client (4.0 and later) may only fetch tokens from URLs its JVM allows: add "
            f"-D{OAUTH_ALLOWED_URLS_PROPERTY}={url} to spark.driver.extraJavaOptions and "
            "spark.executor.extraJavaOptions (for Spark Connect: the server's). The client said: " + said)
    said = _said(text, _TOKEN_NOT_FETCHED)
    if said and settings.uses_oauth:
        client = settings.oauth_client()
        return ConfigurationError(
            f"a Kafka client could not get an OAuth token for client {client.client_id!r} from the token endpoint "
            f"{client.token_endpoint} (sasl.oauthbearer.token.endpoint.url of {settings.origin}): fix "
            "sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret, or the URL if the endpoint cannot be "
            f"reached from the Spark executors; retrying with the same settings cannot succeed. The client said: "
            f"{said}")
    said = _said(text, _LOGIN_REFUSED)
    if said and settings.uses_oauth:
        return ConfigurationError(
            f"the Kafka brokers at {servers} refused the OAuth token of {settings.principal} from "
            f"{settings.properties.get('sasl.oauthbearer.token.endpoint.url')}: the brokers must trust the token's "
            "issuer and signing keys (their sasl.oauthbearer.jwks.endpoint.url) and accept its audience "
            f"(sasl.oauthbearer.expected.audience); check sasl.oauthbearer.client.id, the scope and the token "
            f"endpoint in {settings.origin}; retrying with the same settings cannot succeed. The client said: {said}")
    if said:
        mechanism = settings.properties.get("sasl.mechanism", "").upper() or "?"
        return ConfigurationError(
            f"the Kafka brokers at {servers} refused the SASL login of {settings.principal} "
            f"(sasl.mechanism={mechanism}): fix sasl.username and sasl.password (or sasl.jaas.config) in "
            f"{settings.origin}; retrying with the same credentials cannot succeed. The client said: {said}")
    said = _said(text, _HOST_NOT_IN_CERTIFICATE)
    if said:
        return ConfigurationError(
            f"the TLS certificate of the Kafka brokers at {servers} is not issued for the host names in "
            f"bootstrap.servers ({settings.origin}): connect with a name the certificate lists, or (only for tests) "
            f"set ssl.endpoint.identification.algorithm=none in {settings.origin}. The client said: {said}")
    said = _said(text, _UNTRUSTED_CERTIFICATE)
    if said:
        return ConfigurationError(
            f"the TLS certificate of the Kafka brokers at {servers} is not signed by a CA the client trusts "
            f"(ssl.ca.location={settings.ca_file() or 'unset: the system CAs'} in {settings.origin}): set "
            f"ssl.ca.location to the PEM file of the CA that signed the brokers' certificates. The client said: "
            f"{said}")
    for resource, words in _DENIED.items():
        said = _said(text, words)
        if said:
            denied = _denied(settings, resource, tuple(topics), topic_operations, transactional_id,
                             transactional_id_prefix, topic_pattern)
            return ConfigurationError(f"{denied}. The client said: {said}")
    return None


def _denied(settings: KafkaSettings, resource: str, topics, topic_operations: str, transactional_id: str | None,
            prefix: str | None, topic_pattern: str | None = None) -> str:
    who = f"{settings.principal} of {settings.origin}"
    principal = f"User:{settings.principal_name()}" if settings.principal_name() else "<the client's principal>"
    if resource == "transactional_id":
        name = prefix or transactional_id or "<transactional id prefix>"
        what = f"transactional id {transactional_id!r}" if transactional_id else "its transactional ids"
        return (f"the Kafka brokers at {settings.bootstrap_servers} do not let {who} use {what}: grant WRITE and "
                f"DESCRIBE on the transactional ids with prefix {name!r} (kafka-acls --add --allow-principal "
                f"{principal} --operation Write --operation Describe --transactional-id {name} "
                "--resource-pattern-type prefixed), or connect as a user that has them")
    if resource == "topic":
        operations = " ".join(f"--operation {op.capitalize()}" for op in topic_operations.split(" and "))
        if not topics and topic_pattern:  # Kafka's ACLs name topics literally or by prefix, never by pattern
            return (f"the Kafka brokers at {settings.bootstrap_servers} do not let {who} {topic_operations} the "
                    f"topics matching topic_pattern {topic_pattern!r}: grant {topic_operations} on each of them "
                    f"(kafka-acls --add --allow-principal {principal} {operations} --topic <each matching topic>, "
                    "or --topic <their common prefix> --resource-pattern-type prefixed), or connect as a user "
                    "that has them")
        named = ", ".join(topics) if topics else "<topic>"
        return (f"the Kafka brokers at {settings.bootstrap_servers} do not let {who} {topic_operations} topic(s) "
                f"{named}: grant {topic_operations} on them (kafka-acls --add --allow-principal {principal} "
                f"{operations} --topic {topics[0] if topics else '<topic>'}), or connect as a user that has them")
    if resource == "group":
        return (f"the Kafka brokers at {settings.bootstrap_servers} do not let {who} use a consumer group: grant "
                "READ on the group (kafka-acls --add --allow-principal "
                f"{principal} --operation Read --group <group>)")
    return (f"the Kafka brokers at {settings.bootstrap_servers} refuse {who} a cluster operation: grant "
            "DESCRIBE_CONFIGS (the Kafka sink reads transaction.max.timeout.ms) and IDEMPOTENT_WRITE on the cluster "
            f"(kafka-acls --add --allow-principal {principal} --operation DescribeConfigs --operation "
            "IdempotentWrite --cluster)")


def _said(text: str, words: tuple[str, ...]) -> str | None:
    """The client's line that says one of `words` (case-insensitive), shortened; None when none does."""
    for line in text.splitlines():
        lowered = line.lower()
        if any(word.lower() in lowered for word in words):
            line = line.strip(" \t:")
            return line if len(line) <= 300 else line[:300] + "..."
    return None


def diagnose(settings: KafkaSettings, timeout_s: float = DIAGNOSIS_TIMEOUT_S) -> Diagnosis:
    """Connect to the bootstrap servers as the settings say, and tell what stops a client.

    Each server is tried in turn until one answers (a client bootstraps from any of them, so one dead server is
    not the answer); the ones that did not are named, as a node that is down, with what to do about it.
    """
    protocol = settings.security_protocol
    servers = [s.strip() for s in settings.bootstrap_servers.split(",") if s.strip()]
    unreachable: list[str] = []
    closed: list[tuple[str, ConfigurationError]] = []  # accepted, then closed without a byte
    for server in servers:
        try:
            host, port = host_and_port(server)
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except (OSError, ValueError) as exc:
            unreachable.append(f"{server}: {getattr(exc, 'strerror', None) or exc}")
            continue
        try:
            with sock:
                error = (_check_tls(settings, sock, host, server) if protocol.endswith("SSL")
                         else _check_plaintext(settings, sock, server))
        except _ClosedWithoutAnswer as exc:
            closed.append((server, exc.args[0]))
            continue
        except _Silent as exc:
            unreachable.append(str(exc))
            continue
        login = "not needed"
        if error is None and protocol.startswith("SASL"):
            error, login = _check_login(settings, server, timeout_s)
        not_reached = (*unreachable, *(f"{s}: closed the connection without answering" for s, _ in closed))
        if error is not None:
            others = f" (not reached: {'; '.join(not_reached)})" if not_reached else ""
            return Diagnosis(error, f"{server}: {error}{others}", not_reached=not_reached)
        answered = f"{server} accepts connections and the {protocol} handshake (SASL login: {login})"
        return Diagnosis(None, answered + (_down(settings, not_reached) if not_reached else ""),
                         not_reached=not_reached)
    if closed:  # every server that accepted closed at once: their listener speaks another protocol
        server, error = closed[0]
        others = "; ".join((*unreachable, *(s for s, _ in closed[1:])))
        return Diagnosis(error, f"{server}: {error}" + (f" (also: {others})" if others else ""))
    return Diagnosis(None, "; ".join(unreachable) or "no bootstrap servers", reachable=False)


def _down(settings: KafkaSettings, not_reached: tuple[str, ...]) -> str:
    """What a caller's message says of servers that did not answer while another one did."""
    return (f"; but not reached: {'; '.join(not_reached)}: a node of the cluster is down or cannot be reached from "
            "here, not an ACL or settings problem: restart that node, or remove it from bootstrap.servers of "
            f"{settings.origin} if it left the cluster; a retry goes through the nodes that answer")


def _check_tls(settings: KafkaSettings, sock: socket.socket, host: str, server: str) -> ConfigurationError | None:
    try:
        context = settings.ssl_context()
    except (OSError, ssl.SSLError) as exc:
        return ConfigurationError(f"the TLS files named in {settings.origin} cannot be used ({exc}): check "
                                  "ssl.ca.location, ssl.certificate.location and ssl.key.location")
    try:
        with context.wrap_socket(sock, server_hostname=host):
            return None
    except ssl.SSLCertVerificationError as exc:
        return explain_refusal(settings, f"CERTIFICATE_VERIFY_FAILED: {exc.verify_message or exc}")
    except ssl.SSLError as exc:
        if any(sign in str(exc) for sign in _CLOSED):
            raise _ClosedWithoutAnswer(ConfigurationError(
                f"the Kafka listener at {server} closed the connection during the TLS handshake ({exc}): it "
                f"probably does not speak TLS, but {settings.origin} says security.protocol="
                f"{settings.security_protocol}: set security.protocol to the listener's protocol (PLAINTEXT or "
                "SASL_PLAINTEXT)")) from exc
        if any(sign in str(exc) for sign in _NOT_TLS):
            return ConfigurationError(
                f"the Kafka listener at {server} does not speak TLS, but {settings.origin} says "
                f"security.protocol={settings.security_protocol}: set security.protocol to the listener's protocol "
                f"(PLAINTEXT or SASL_PLAINTEXT). ({exc})")
        return ConfigurationError(
            f"the Kafka brokers at {server} ended the TLS handshake ({exc}): if they require client certificates, "
            f"set ssl.certificate.location and ssl.key.location in {settings.origin}")
    except socket.timeout as exc:
        raise _Silent(f"{server}: accepted the connection but did not answer the TLS handshake within "
                      f"{sock.gettimeout():g} s (a paused, hung or overloaded node)") from exc
    except OSError as exc:  # closed during the handshake
        raise _ClosedWithoutAnswer(ConfigurationError(
            f"the Kafka listener at {server} did not complete a TLS handshake ({exc}): it probably does not speak "
            f"TLS; set security.protocol in {settings.origin} to the listener's protocol")) from exc


def _check_plaintext(settings: KafkaSettings, sock: socket.socket, server: str) -> ConfigurationError | None:
    """Send ApiVersions v0; a TLS listener closes the connection (or answers with a TLS alert). Raises _Silent when
    nothing comes back: the node is paused or hung, which says nothing about the settings."""
    try:
        if api_versions_answered(sock):
            return None  # a Kafka answer in plaintext
    except socket.timeout as exc:
        raise _Silent(f"{server}: accepted the connection but gave no answer within {sock.gettimeout():g} s "
                      "(a paused, hung or overloaded node)") from exc
    except (NoAnswer, OSError) as exc:
        raise _ClosedWithoutAnswer(_expects_tls(settings, server)) from exc
    return _expects_tls(settings, server)


def _expects_tls(settings: KafkaSettings, server: str) -> ConfigurationError:
    return ConfigurationError(
        f"the Kafka listener at {server} closed the connection on a plaintext request: it expects TLS; set "
        f"security.protocol=SSL (or SASL_SSL) and ssl.ca.location in {settings.origin}")


def _check_login(settings: KafkaSettings, server: str, timeout_s: float) -> tuple[ConfigurationError | None, str]:
    """One SASL login with librdkafka at `server` (one that answered): the ConfigurationError of a refused one, and
    what was found."""
    try:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient
    except ImportError:  # the official Kafka provider brings it; without it the login stays unchecked
        return None, "not checked, confluent-kafka is not installed"
    errors: list = []
    config: dict[str, Any] = {k: v for k, v in settings.librdkafka().items()
              if k in _LIBRDKAFKA_KEYS or k.startswith(("sasl.", "ssl."))}
    config.update({"bootstrap.servers": server, "error_cb": errors.append, "log_level": 0,
                   "socket.timeout.ms": int(timeout_s * 1000)})
    try:
        admin = AdminClient(config)
    except (KafkaException, ValueError, TypeError) as exc:
        return None, f"not checked, librdkafka refused the settings ({exc})"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=0.5)
            return None, "accepted"
        except KafkaException:
            admin.poll(0)
        refused = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
        if refused:
            return explain_refusal(settings, f"SASL authentication error: {refused[0].str()}"), "refused"
    return None, f"no answer within {timeout_s:.0f} s"
