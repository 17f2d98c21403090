"""Samples, every few seconds of a freshness run, what must stay flat for an hour (issue 51): the resident memory of
each long-lived process, the Java heap in use of those that are JVMs, and the number of batches in the pipeline's
ledger."""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Any, Callable

import psutil

from airflow_exactly_once.core.ledger import Ledger
from benchmarks.freshness_series import WINDOW_SECONDS
from benchmarks.freshness_watcher import Watcher


def family(pid: int) -> list[psutil.Process]:
    """A process and all its descendants; empty when it is gone."""
    try:
        process = psutil.Process(pid)
        return [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def rss_with_children(pid: int) -> int:
    """Resident bytes of a process and all its descendants (0 when it is gone)."""
    total = 0
    for member in family(pid):
        try:
            total += member.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def memory_mb(pids: dict[str, int | None]) -> dict[str, float]:
    """Resident MB (with children) per named process; 0 for one that is down (pid None)."""
    return {name: round(rss_with_children(pid) / 2**20, 1) if pid else 0.0 for name, pid in pids.items()}


HEAP_USED_COLUMNS = ("S0U", "S1U", "EU", "OU")  # survivors, eden, old: `jstat -gc`'s used KB of the Java heap


def heap_used_kb(jstat_gc: str) -> float:
    """The Java heap in use, KB, from `jstat -gc`'s two lines (header, values): what resident memory hides, since a
    JVM keeps the heap it once committed resident whether it still holds objects there or not."""
    header, values = (line.split() for line in jstat_gc.strip().splitlines()[-2:])
    row = dict(zip(header, values))
    return sum(float(row[column]) for column in HEAP_USED_COLUMNS)


def java_heap_mb(pid: int) -> float | None:
    """MB of Java heap in use summed over the JVMs among a process and its descendants; None: no JVM there, or
    `jstat` (the JDK's, `make setup` installs it) missing or refused."""
    jstat = shutil.which("jstat")
    jvms = []
    for member in family(pid):
        try:
            if member.name() == "java":
                jvms.append(member.pid)
        except psutil.NoSuchProcess:
            pass
    if jstat is None or not jvms:
        return None
    total = 0.0
    for jvm in jvms:
        done = subprocess.run([jstat, "-gc", str(jvm)], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            return None
        total += heap_used_kb(done.stdout)
    return round(total / 1024, 1)


def ledger_batch_count(ledger_url: str, pipeline_id: str) -> int | None:
    """Batches of the pipeline in the ledger, in any state (what retention bounds); None when the ledger could not be
    read this time (a SQLite ledger locked by a commit, not created yet): a gap in the series, not a failed run."""
    ledger = Ledger.read_only(ledger_url)
    try:
        return sum(ledger.count_batches(pipeline_id, with_interval=tied) for tied in (False, True))
    except Exception:  # noqa: BLE001 - any read failure is a missing point
        return None
    finally:
        ledger.engine.dispose()


class Sampler(Watcher):
    """Every `interval` seconds from `begin`: the memory of the processes `pids()` names now (a restarted one has a
    new pid), the heap in use of the JVMs among them every `heap_every`-th time (a `jstat` is a JVM start), and the
    ledger's batch count, each with its time in seconds from the start."""

    what = "the sampler"

    def __init__(self, pids: Callable[[], dict[str, int | None]], ledger_url: str, pipeline_id: str,
                 interval: float = WINDOW_SECONDS, heap_every: int = 3) -> None:
        super().__init__("sampler")
        self.pids, self.ledger_url, self.pipeline_id, self.interval = pids, ledger_url, pipeline_id, interval
        self.heap_every = heap_every
        self.samples: list[dict[str, Any]] = []

    def watch(self) -> None:
        while True:
            at = time.time()
            pids = self.pids()
            sample = {"t": round(at - self.started_at, 1), "memory_mb": memory_mb(pids),
                      "ledger_batches": ledger_batch_count(self.ledger_url, self.pipeline_id)}
            if len(self.samples) % self.heap_every == 0:
                heaps = {name: java_heap_mb(pid) for name, pid in pids.items() if pid}
                sample["heap_mb"] = {name: mb for name, mb in heaps.items() if mb is not None}
            self.samples.append(sample)
            if self.pause(at + self.interval - time.time()):
                return
