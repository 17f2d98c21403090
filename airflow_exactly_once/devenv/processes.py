"""Local service processes: tell when one died (with its log), stop one cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def check_alive(processes: dict[str, subprocess.Popen], log_dir: Path, what: str) -> None:
    """Raise with the tail of its log if any named process has exited."""
    for name, process in processes.items():
        if process.poll() is not None:
            log = (log_dir / f"{name}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{what} {name} exited with code {process.returncode}:\n{log}")


def stop_session(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM the process's session (it was started with start_new_session), SIGKILL if it lingers."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
