"""The dev tooling's own pieces that used to make CI fail by chance: cluster ids and ports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from devtools import kafka_broker, ports


def test_cluster_ids_never_look_like_an_option():
    """The storage tool read an id beginning with '-' as an option (one draw in 64)."""
    for _ in range(20_000):
        drawn = kafka_broker.cluster_id()
        assert len(drawn) == 22 and not drawn.startswith("-"), drawn
        args = kafka_broker.format_arguments(Path("/x/server.properties"), drawn)
        assert args == ["format", f"--cluster-id={drawn}", "--config", "/x/server.properties"]


def test_a_dash_first_draw_is_drawn_again(monkeypatch):
    draws = iter([b"\xf8" + bytes(15), bytes(range(16))])  # base64url of 0xf8... begins with '-'
    monkeypatch.setattr(kafka_broker.os, "urandom", lambda n: next(draws))
    assert kafka_broker.cluster_id() == "AAECAwQFBgcICQoLDA0ODw"


def test_reserved_ports_are_outside_the_ephemeral_range_and_exclusive():
    low, high = ports._ephemeral_range()
    reserved = [ports.reserve_port() for _ in range(20)]
    try:
        assert len(set(reserved)) == 20
        assert all(not low <= port <= high for port in reserved)
        # Another process (a parallel test session) cannot take a port this one holds.
        probe = (f"import fcntl, os; fd = os.open({str(ports.LOCK_DIR / f'{reserved[0]}.lock')!r}, os.O_RDWR)\n"
                 "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('taken')\n"
                 "except OSError:\n    print('held')")
        answer = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        assert answer.stdout.strip() == "held"
    finally:
        for port in reserved:
            ports.release_port(port)
