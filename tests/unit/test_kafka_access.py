"""kafka.access.diagnose tries every bootstrap server until one accepts, and names those that did not (real sockets
on 127.0.0.1: ports that refuse, and one that listens)."""

from __future__ import annotations

import socket

import pytest

from airflow_exactly_once.kafka.access import diagnose
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


def test_a_server_that_listens_behind_four_dead_ones_is_found_and_the_dead_ones_named(refusing):
    with socket.create_server(("127.0.0.1", 0)) as listening:  # accepts, answers nothing: a silent listener
        alive = f"127.0.0.1:{listening.getsockname()[1]}"
        found = diagnose(KafkaSettings(",".join([*refusing, alive])), timeout_s=0.5)
    assert found.reachable and found.error is None
    assert found.detail.startswith(f"{alive} accepts connections")
    assert all(f"{server}: Connection refused" in found.detail for server in refusing)


def test_when_no_server_answers_the_detail_names_every_one(refusing):
    found = diagnose(KafkaSettings(",".join(refusing)), timeout_s=0.5)
    assert not found.reachable and found.error is None
    assert found.detail == "; ".join(f"{server}: Connection refused" for server in refusing)
