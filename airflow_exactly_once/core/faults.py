"""Named crash points, so tests can kill a real task process at an exact protocol step.

Inert unless AIRFLOW_EXACTLY_ONCE_FAULTS names a folder. A file `<point>` in it holds
"<action> <times>"; each time the point is reached with times > 0 the count drops by
one and the action runs: `kill` (SIGKILL this process, as a dying worker would),
`stop` (SIGSTOP this process: it stays at the point, frozen, for a test that then kills
more than the task, e.g. its whole Celery worker, as a lost machine), `pause` (SIGSTOP
too, but once a test sends SIGCONT the process goes on as if nothing happened: for a test
that breaks a server while the task waits at the point) or `raise` (an ordinary task failure).
"""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path

ENV = "AIRFLOW_EXACTLY_ONCE_FAULTS"

POINTS = (
    "plan.before_check",  # plan task started, nothing asked of the sink or Kafka yet
    "plan.after_ledger",  # batch PLANNED, plan task not yet finished
    "write.before_stage",  # claimed, Spark not yet run
    "write.after_stage",  # output staged, batch not yet PREPARED
    "write.after_prepare",  # batch PREPARED, write task not yet finished
    "notify.before_sink_commit",  # batch PREPARED, sink not yet committed
    "notify.after_dead_letter_commit",  # dead letters published, the output not yet
    "notify.mid_sink_commit",  # a sink published part of a batch (Parquet on S3: one file), not all of it yet
    "notify.after_sink_commit",  # sink output published, ledger not yet COMMITTED
    "notify.after_ledger",  # batch COMMITTED, notify task not yet finished
    "ledger.migrate.after_step",  # a schema migration step ran, its transaction not yet committed
    "prune.between_transactions",  # retention pruned some batches (committed), more still to prune
)


class InjectedFault(RuntimeError):
    pass


def fault_point(point: str) -> None:
    folder = os.environ.get(ENV)
    if not folder:
        return
    path = Path(folder) / point
    if not path.exists():
        return
    with open(path, "r+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        action, _, times = handle.read().strip().partition(" ")
        remaining = int(times or "1")
        if remaining <= 0:
            return
        handle.seek(0)
        handle.truncate()
        handle.write(f"{action} {remaining - 1}")
        handle.flush()
    with open(Path(folder) / "fired.log", "a") as log:
        log.write(f"{point} {action} pid={os.getpid()}\n")
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action in ("stop", "pause"):
        os.kill(os.getpid(), signal.SIGSTOP)
    if action == "pause":
        return
    raise InjectedFault(f"injected fault at {point}")


def arm(folder: str | Path, point: str, action: str = "kill", times: int = 1) -> None:
    """Test helper: make `point` fire `times` times."""
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; known: {', '.join(POINTS)}")
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / point).write_text(f"{action} {times}")
