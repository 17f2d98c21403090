"""kafka.access.diagnose tries every bootstrap server until one answers, and names those that did not (real sockets
on 127.0.0.1: ports that refuse, one that listens, fake servers that close at once or answer as Kafka does)."""

from __future__ import annotations

import socket
import struct
import threading

import pytest
from kafka.errors import KafkaConnectionError

from airflow_exactly_once.core.errors import ConfigurationError, SinkError
from airflow_exactly_once.kafka.access import diagnose, explain_failure
from airflow_exactly_once.kafka.settings import KafkaSettings


@pytest.fixture
def refusing():
    """Addresses that refuse connections: ports bound but never listening, held until the test ends."""
    held = [socket.socket() for _ in range(4)]
    for sock in held:
        sock.bind(("127.0.0.1", 0))
    yield [f"127.0.0.1:{sock.getsockname()[1]}" for sock in held]
    for sock in held:
        sock.close()


def test_a_server_that_answers_behind_dead_and_paused_ones_is_found_and_the_others_named(refusing):
    """A paused node (the kernel accepts, nothing answers) is not taken for the server that accepts connections: the
    diagnosis names it as not answering, and the detail starts with the server that did answer (issue 61)."""
    kafka = FakeServer("kafka")
    with socket.create_server(("127.0.0.1", 0)) as listening:  # accepts, answers nothing: a paused node
        paused = f"127.0.0.1:{listening.getsockname()[1]}"
        found = diagnose(KafkaSettings(",".join([*refusing[:2], paused, kafka.address])), timeout_s=0.5)
        alone = diagnose(KafkaSettings(paused), timeout_s=0.5)
    assert found.reachable and found.error is None
    assert found.detail.startswith(f"{kafka.address} accepts connections")
    assert all(f"{server}: Connection refused" in found.detail for server in refusing[:2])
    assert f"{paused}: accepted the connection but gave no answer within 0.5 s" in found.detail
    assert not alone.reachable and alone.detail.startswith(f"{paused}: accepted the connection but gave no answer")


def test_when_no_server_answers_the_detail_names_every_one(refusing):
    found = diagnose(KafkaSettings(",".join(refusing)), timeout_s=0.5)
    assert not found.reachable and found.error is None
    assert found.detail == "; ".join(f"{server}: Connection refused" for server in refusing)


class FakeServer:
    """A loopback server that answers each connection as `answer` says, on a thread: `closer` closes it at once
    without a byte (a dead node behind a proxy, or a listener of another protocol); `kafka` answers ApiVersions
    as a plaintext Kafka listener does (the correlation id back)."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                if self.answer == "kafka":
                    request = conn.recv(64)
                    correlation_id = request[8:12]
                    conn.sendall(struct.pack(">i", 4) + correlation_id)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def servers():
    made: list[FakeServer] = []
    yield lambda answer: made.append(FakeServer(answer)) or made[-1]
    for server in made:
        server.close()


def test_a_node_that_died_behind_a_proxy_is_named_down_not_a_wrong_protocol(servers, refusing):
    dead_behind_proxy, alive = servers("closer"), servers("kafka")
    settings = KafkaSettings(",".join([refusing[0], dead_behind_proxy.address, alive.address]))
    found = diagnose(settings, timeout_s=2.0)
    assert found.reachable and found.error is None  # before: "it expects TLS", a ConfigurationError
    assert found.not_reached == (f"{refusing[0]}: Connection refused",
                                 f"{dead_behind_proxy.address}: closed the connection without answering")
    assert found.detail.startswith(f"{alive.address} accepts connections")


def test_the_error_of_a_client_after_a_nodes_death_names_the_node_and_the_fix_and_blames_no_acl(servers, refusing):
    alive = servers("kafka")
    settings = KafkaSettings(f"{refusing[0]},{alive.address}")
    failure = KafkaConnectionError(f"Connection at {refusing[0]} closed: [Errno 111] ECONNREFUSED")
    error = explain_failure(settings, failure, "committing the Kafka transactions of batch 3",
                            lambda message: SinkError(message, retriable=True), topics=("out",),
                            topic_operations="WRITE and DESCRIBE", transactional_id_prefix="p")
    assert isinstance(error, SinkError) and error.retriable
    message = str(error)
    assert f"not reached: {refusing[0]}: Connection refused" in message
    assert "a node of the cluster is down" in message and "not an ACL or settings problem" in message
    assert "restart that node, or remove it from bootstrap.servers" in message
    assert "grant" not in message and "kafka-acls" not in message


def test_when_every_server_that_accepts_closes_at_once_the_protocol_is_blamed(servers, refusing):
    first, second = servers("closer"), servers("closer")
    found = diagnose(KafkaSettings(f"{refusing[0]},{first.address},{second.address}"), timeout_s=2.0)
    assert isinstance(found.error, ConfigurationError) and "expects TLS" in str(found.error)
    assert first.address in found.detail and second.address in found.detail and refusing[0] in found.detail


def test_a_write_refused_for_too_few_in_sync_replicas_says_so_and_is_retriable():
    """With min.insync.replicas not met (two nodes of three away), Kafka refuses the write: the error names the
    setting and what to do, and the task's retry writes again once the nodes are back (issue 61)."""
    error = explain_failure(KafkaSettings("127.0.0.1:1,127.0.0.1:2"),
                            "KafkaError{code=NOT_ENOUGH_REPLICAS,val=19,str=\"Broker: Not enough in-sync replicas\"}",
                            "writing partition 0", lambda message: SinkError(message, retriable=True))
    assert isinstance(error, SinkError) and error.retriable
    assert "min.insync.replicas" in str(error) and "bring the nodes back" in str(error)
