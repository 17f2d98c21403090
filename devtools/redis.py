"""A real Redis server on 127.0.0.1 (Debian's `redis-server`), as Celery's broker for tests and benchmarks.

Started with an append-only file synced on every write, as a broker that must not lose queued tasks runs: a
SIGKILLed server restarted on the same folder (`kill`, then `start`) still holds what was queued. No password,
loopback only; not for production.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

from devtools.ports import reserve_port
from devtools.processes import LocalServer, stop_session, wait_ready

INSTALL_HINT = ("Install Debian's Redis server: `sudo apt-get install redis-server` (`make system-deps` does), or put "
                "a `redis-server` binary on PATH.")


def redis_server_binary() -> str:
    """The `redis-server` to run; an error that says how to install it when there is none."""
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError(f"redis-server not found on PATH. {INSTALL_HINT}")
    return found


class LocalRedis(LocalServer):
    """One Redis server whose files (append-only file, log) live in `data_dir`, on a reserved port kept across
    restarts."""

    def __init__(self, data_dir: str | Path, port: int = 0) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.port = port or reserve_port()

    @property
    def log_file(self) -> Path:
        return self.data_dir / "redis.log"

    def url(self, database: int = 0) -> str:
        """Celery's broker URL (kombu's redis transport)."""
        return f"redis://127.0.0.1:{self.port}/{database}"

    def _command(self) -> list[str]:
        return [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.data_dir),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
                "--protected-mode", "no", "--logfile", str(self.log_file)]

    def start(self, timeout: float = 30.0) -> "LocalRedis":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = self._command()
        self.process = subprocess.Popen(command, cwd=self.data_dir, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        if wait_ready(self.ping, self.process, timeout):
            return self
        if self.process.poll() is None:
            self.stop()
            raise RuntimeError(f"redis-server did not answer PING on 127.0.0.1:{self.port} within {timeout:.0f}s; "
                               f"see {self.log_file}")
        stderr = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
        log = self.log_file.read_text(errors="replace")[-3000:] if self.log_file.exists() else ""
        self.process = None
        raise RuntimeError(f"redis-server exited at start on 127.0.0.1:{self.port} ({' '.join(command)}):\n"
                           f"{stderr}{log}\n{INSTALL_HINT}")

    def ping(self) -> bool:
        """Whether the server answers PING (the protocol's inline form: no client library needed)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is not None:
            stop_session(self.process, timeout)
            self.process = None

    def __repr__(self) -> str:
        return f"LocalRedis(127.0.0.1:{self.port}, {self.data_dir})"
