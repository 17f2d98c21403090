"""kafka.liveness: which servers answer, on local sockets that behave as a running, a paused and a dead node do."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from airflow_exactly_once.kafka import liveness
from airflow_exactly_once.kafka.settings import KafkaSettings


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def _address(sock: socket.socket) -> str:
    return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def answering() -> Iterator[str]:
    """A server that answers ApiVersions with a Kafka response header (correlation id 1), as a broker does."""
    sock = _listener()

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                size = struct.unpack(">i", conn.recv(4))[0]
                conn.recv(size)
                conn.sendall(struct.pack(">ii", 6, 1) + b"\0" * 6)

    threading.Thread(target=serve, daemon=True).start()
    yield _address(sock)
    sock.close()


@pytest.fixture
def paused() -> Iterator[str]:
    """A server whose kernel accepts connections but whose process never reads them: a SIGSTOPped broker."""
    sock = _listener()
    yield _address(sock)
    sock.close()


@pytest.fixture
def dead() -> str:
    """A port nothing listens on: a killed broker (connection refused)."""
    sock = _listener()
    address = _address(sock)
    sock.close()
    return address


def test_a_paused_and_a_dead_server_are_named_and_a_running_one_is_not(answering, paused, dead):
    started = time.monotonic()
    found = liveness.silent(KafkaSettings(""), {1: answering, 2: paused, 3: dead}, timeout_s=1.0)
    assert set(found) == {2, 3}
    assert "no answer within 1 s" in found[2]
    assert "refused" in found[3].lower()
    assert time.monotonic() - started < 1.9  # asked at once, not one after the other


def test_a_client_bootstraps_only_from_servers_that_answer(answering, paused, dead):
    """kafka-python picks a bootstrap server at random and waits its whole bound on a paused one."""
    settings = KafkaSettings(f"{paused},{answering},{dead}", origin="connection 'kafka_default'")
    started = time.monotonic()
    narrowed = liveness.reachable(settings, timeout_s=3.0)
    assert narrowed.bootstrap_servers == answering
    assert narrowed.origin == settings.origin
    assert time.monotonic() - started < 1.5  # one answer is enough: the paused one is not waited for


def test_the_servers_are_kept_when_none_answers_or_there_is_one(paused, dead, answering):
    """Then the client fails as before and kafka.access diagnoses it; a single server is not asked at all."""
    both = KafkaSettings(f"{paused},{dead}")
    assert liveness.reachable(both, timeout_s=0.5) == both
    alone = KafkaSettings(paused)
    started = time.monotonic()
    assert liveness.reachable(alone) == alone
    assert time.monotonic() - started < 0.1


def test_the_docs_figures_of_a_node_away_are_the_codes():
    """docs/sinks/kafka.md's section on a node away states the bounds a user plans with: they are the constants."""
    import re
    from pathlib import Path

    from airflow_exactly_once.kafka.access import PROBE_BOOTSTRAP_TIMEOUT_MS

    page = (Path(__file__).resolve().parents[2] / "docs" / "sinks" / "kafka.md").read_text()
    section = page[page.index("## A node of the cluster away"):page.index("## Consumer-group mirror")]
    section = " ".join(section.split())
    assert f"{liveness.ANSWER_TIMEOUT_S:g} s at most" in section
    assert f"does not answer within {liveness.ANSWER_TIMEOUT_S:g} s" in section
    assert f"bootstrap bound ({PROBE_BOOTSTRAP_TIMEOUT_MS // 1000} s)" in section
    assert f"for up to {liveness.PATIENCE_S:g} s" in section
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    [kafka4] = re.findall(r"^KAFKA4_VERSION \?= (\S+)", makefile, re.M)
    assert f"Kafka {kafka4}, three nodes" in section
