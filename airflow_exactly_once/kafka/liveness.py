"""Which Kafka servers answer now: asked of all of them at once, within a short bound.

A node that died refuses connections at once, but one that is paused (a long GC pause, SIGSTOP, a hung machine) or
cut off accepts the connection, or lets it hang, and never answers. kafka-python's clients bootstrap from one server
picked at random and then wait their whole bootstrap bound on it; a request sent to such a broker waits the client's
request timeout. So clients bootstrap from the servers that answered (`reachable`), and questions that go to every
broker go to the brokers that answered (`silent` names the others, with what happened). A question that failed
because a node did not answer, or no longer leads or coordinates, is asked again for a while (`ask_around`): the
controller fences a dead node within seconds and moves its leaderships and coordinators to the others, as Kafka's
own clients wait for.

"Answered" means the server's Kafka process took part: a plaintext listener returned a Kafka response to ApiVersions
(which a broker serves before any SASL login), a TLS listener completed or refused the handshake. A listener that
spoke but refused the settings counts as answering: the client then fails on it and kafka.access says what to change.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import ssl
import struct
import threading
import time
from typing import Callable, Mapping, TypeVar

import kafka.errors as Errors

from airflow_exactly_once.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)

# How long a server may take to answer before it counts as not answering. A broker answers ApiVersions in
# milliseconds, even busy; seconds mean its process does not run.
ANSWER_TIMEOUT_S = 2.0
# Bootstrapping needs one server: once the first answered, the others get this much longer to answer too.
BOOTSTRAP_GRACE_S = 0.2

# Long enough for the cluster to fence a dead node (Kafka's default broker.session.timeout.ms is 9 s) and for the
# nodes that take its leaderships and transaction-state partitions over to load them; short next to a transaction
# timeout.
PATIENCE_S = 30.0
FIRST_PAUSE_S = 0.5
LONGEST_PAUSE_S = 4.0

Key = TypeVar("Key")
Answer = TypeVar("Answer")

_CLIENT_ID = b"airflow-exactly-once-liveness"
_API_VERSIONS_V0 = struct.pack(">hhih", 18, 0, 1, len(_CLIENT_ID)) + _CLIENT_ID


class NoAnswer(Exception):
    """The server did not answer: the text says what happened (refused, timed out, closed)."""


def api_versions_answered(sock: socket.socket) -> bool:
    """Send ApiVersions v0 on a connected socket; True when a Kafka response (correlation id 1) comes back, False for
    other bytes. Raises socket.timeout when nothing comes within the socket's timeout, OSError when the connection
    breaks, NoAnswer when it is closed without a byte."""
    sock.sendall(struct.pack(">i", len(_API_VERSIONS_V0)) + _API_VERSIONS_V0)
    answer = sock.recv(8)
    if not answer:
        raise NoAnswer("closed the connection without answering")
    return len(answer) >= 8 and struct.unpack(">i", answer[4:8])[0] == 1


def host_and_port(server: str) -> tuple[str, int]:
    """("host", port) of a bootstrap server "host:port" ("[::1]:9092" too); ValueError when the port is not a number."""
    host, _, port = server.rpartition(":")
    return host.strip("[]"), int(port)


def why_silent(settings: KafkaSettings, server: str, timeout_s: float = ANSWER_TIMEOUT_S) -> str | None:
    """None when `server` (host:port) answered within `timeout_s`, else what happened instead."""
    deadline = time.monotonic() + timeout_s
    try:
        host, port = host_and_port(server)
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            if not settings.security_protocol.endswith("SSL"):
                api_versions_answered(sock)  # any Kafka answer, or other bytes: the process runs
                return None
            try:
                with settings.ssl_context().wrap_socket(sock, server_hostname=host):
                    return None
            except ssl.SSLError:  # the listener spoke TLS and refused something: it runs
                return None
    except socket.timeout:
        return f"accepted no connection or gave no answer within {timeout_s:g} s (paused, hung or cut off?)"
    except NoAnswer as exc:
        return str(exc)
    except (OSError, ValueError) as exc:
        return str(getattr(exc, "strerror", None) or exc)


def _ask_all(settings: KafkaSettings, servers: Mapping[Key, str], timeout_s: float,
             enough: float | None) -> dict[Key, str]:
    """Ask every server at once. Returns the ones that did not answer, with why, once all did or `timeout_s` passed;
    with `enough`, already that long after the first answer (the slower ones then count as not answering)."""
    results: dict[Key, str | None] = {}
    done = threading.Condition()

    def ask(key: Key, server: str) -> None:
        why = why_silent(settings, server, timeout_s)
        with done:
            results[key] = why
            done.notify_all()

    for key, server in servers.items():
        threading.Thread(target=ask, args=(key, server), name=f"kafka-liveness-{server}", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    with done:
        while len(results) < len(servers):
            if enough is not None and any(why is None for why in results.values()):
                deadline = min(deadline, time.monotonic() + enough)
                enough = None
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done.wait(left)
        found = dict(results)
    late = f"gave no answer within {timeout_s:g} s"
    return {key: why for key in servers if (why := found.get(key, late)) is not None}


def silent(settings: KafkaSettings, servers: Mapping[Key, str],
           timeout_s: float = ANSWER_TIMEOUT_S) -> dict[Key, str]:
    """The servers (by the caller's key, e.g. a broker id) that did not answer within `timeout_s`, with why."""
    return _ask_all(settings, servers, timeout_s, enough=None) if servers else {}


def reachable(settings: KafkaSettings, timeout_s: float = ANSWER_TIMEOUT_S) -> KafkaSettings:
    """`settings` with bootstrap.servers narrowed to the servers that answer now (in their order), so that a client
    bootstraps from one that answers. Unchanged for a single server, or when none answers (the client then fails
    as before, and kafka.access diagnoses why)."""
    servers = [s.strip() for s in settings.bootstrap_servers.split(",") if s.strip()]
    if len(servers) < 2:
        return settings
    quiet = _ask_all(settings, dict(enumerate(servers)), timeout_s, enough=BOOTSTRAP_GRACE_S)
    answering = [server for index, server in enumerate(servers) if index not in quiet]
    if not answering or not quiet:
        return settings
    return dataclasses.replace(settings, bootstrap_servers=",".join(answering))


def node_unreachable(exc: BaseException) -> bool:
    """Did `exc` come from a node that is down, moving its leaderships or still loading (asking again helps)?"""
    if isinstance(exc, Errors.UnknownBrokerIdError):  # fresh metadata names a node the client has not cached
        return True
    if isinstance(exc, Errors.UnknownTopicOrPartitionError):  # a deleted topic: retrying changes nothing
        return False
    return isinstance(exc, Errors.KafkaError) and bool(getattr(exc, "retriable", False))


def ask_around(what: str, question: Callable[[], Answer], patience_s: float = PATIENCE_S,
               between: Callable[[], None] | None = None) -> Answer:
    """`question()`'s answer, asked again while a node does not answer (`node_unreachable`), up to `patience_s`;
    `between` runs before each new try (a fresh client, say). Raises the last error when the cluster still does not
    answer after that, and any other error at once."""
    deadline = time.monotonic() + patience_s
    pause = FIRST_PAUSE_S
    while True:
        try:
            return question()
        except Errors.KafkaError as exc:
            if not node_unreachable(exc) or time.monotonic() + pause > deadline:
                raise
            log.info("%s: %s (%s); asking again in %.1f s", what, type(exc).__name__, exc, pause)
        time.sleep(pause)
        pause = min(2 * pause, LONGEST_PAUSE_S)
        if between is not None:
            between()
