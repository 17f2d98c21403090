"""Why a Kafka client could not get in, found out actively and quickly.

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

Settings problems come back as the ConfigurationError of KafkaSettings.explain (never worth a
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
    the caller's retriable error. `context` goes to KafkaSettings.explain (topics, transactional ids).
    """
    explained = settings.explain(failure, **context)
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
        return settings.explain(f"CERTIFICATE_VERIFY_FAILED: {exc.verify_message or exc}")
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
            return settings.explain(f"SASL authentication error: {refused[0].str()}"), "refused"
    return None, f"no answer within {timeout_s:.0f} s"
