"""Ports for the local servers that tests, the demo and the benchmarks start.

Binding to port 0 and handing the number to a server that binds it later leaves a window in
which another process can take the port. Two things take ports on a busy machine: the
outgoing connections of every client (the kernel hands them ports from its ephemeral range)
and other servers started by a parallel session. So a port is drawn outside the ephemeral
range, and it is reserved with a lock file that this process holds until it exits; a second
session skips locked ports, and the kernel never gives them to a client.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

LOCK_DIR = Path(tempfile.gettempdir()) / "airflow-exactly-once-ports"
# Below the range the kernel hands to client sockets (32768-60999 on Linux by default).
DEFAULT_RANGE = (15000, 32000)
_held: dict[int, int] = {}  # port -> fd of its lock file, for the life of this process


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def candidate_range() -> tuple[int, int]:
    """Where ports are drawn: DEFAULT_RANGE, minus any part the kernel uses for client sockets."""
    low, high = DEFAULT_RANGE
    eph_low, eph_high = _ephemeral_range()
    if eph_low <= low < eph_high:
        low = eph_high + 1
    if eph_low < high <= eph_high:
        high = eph_low - 1
    if high - low < 100:
        raise RuntimeError(f"no room for local server ports outside the ephemeral range {eph_low}-{eph_high}")
    return low, high


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def reserve_port() -> int:
    """A free loopback port that no other session of this project and no client socket will take."""
    LOCK_DIR.mkdir(mode=0o777, parents=True, exist_ok=True)
    low, high = candidate_range()
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.randrange(low, high)
        if port in _held:
            continue
        fd = os.open(LOCK_DIR / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        if _bindable(port):
            _held[port] = fd
            return port
        os.close(fd)  # someone outside this project listens there
    raise RuntimeError(f"found no free port in {low}-{high} after 500 draws")


def release_port(port: int) -> None:
    """Give a reservation back early (ports are released anyway when the process exits)."""
    fd = _held.pop(port, None)
    if fd is not None:
        os.close(fd)
