"""Local service processes: tell when one died (with its log), stop one cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil


class LocalServer:
    """What the dev tooling's servers share: `with` starts and stops one, `kill` crashes it as a
    lost machine would, `restart` brings it back on the same data. Subclasses start; one whose
    `process` leads its own session (start_new_session) is stopped by the default `stop`."""

    process: subprocess.Popen | None = None

    def start(self) -> "LocalServer":
        raise NotImplementedError

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the server's session, SIGKILL it if it lingers (stop_session)."""
        if self.process is not None:
            stop_session(self.process, timeout)
            self.process = None

    def kill(self) -> None:
        """SIGKILL the server: no shutdown hook runs, what it kept in memory is gone."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def check_alive(processes: dict[str, subprocess.Popen], log_dir: Path, what: str) -> None:
    """Raise with the tail of its log if any named process has exited."""
    for name, process in processes.items():
        if process.poll() is not None:
            log = (log_dir / f"{name}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{what} {name} exited with code {process.returncode}:\n{log}")


def wait_ready(ready: Callable[[], bool], process: subprocess.Popen, timeout: float, poll: float = 0.2) -> bool:
    """Poll `ready` until it holds (True), or until `process` exits or `timeout` passes (False)."""
    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(poll)
    return False


def stop_session(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM the process's session (it was started with start_new_session), SIGKILL if it lingers."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def marked_processes(name: str, value: str) -> list[psutil.Process]:
    """Running processes whose environment has `name=value` (every child of a test session inherits it)."""
    found = []
    for process in psutil.process_iter(["pid", "status"]):
        if process.pid == os.getpid() or process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if process.environ().get(name) == value:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def leftover_processes(name: str, value: str, grace_s: float = 20.0) -> list[str]:
    """What is still running with the mark after `grace_s` (a server may take a moment to exit); kills it.

    Returns a description of each leftover, empty when every process ended.
    """
    deadline = time.monotonic() + grace_s
    while True:
        alive = marked_processes(name, value)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    described = []
    for process in alive:
        try:
            described.append(f"pid {process.pid}: {' '.join(process.cmdline())[:300]}")
            process.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return described
