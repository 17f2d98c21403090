"""Make a child process die with its parent, so that no Spark job outlives who started it.

Airflow kills a task with SIGKILL when its worker dies or a heartbeat is lost; nothing in the
task process runs then, so it cannot stop the spark-submit it started. Linux can: a process
that asked with prctl(PR_SET_PDEATHSIG) receives a signal when its parent goes away.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (no-op outside Linux).

    Safe as a `preexec_fn`: system calls only, no locks. If the parent died before the request
    took effect (this process was re-parented meanwhile), exit at once.
    """
    if _libc is None:
        return
    parent = os.getppid()
    _libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
