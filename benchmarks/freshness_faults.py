"""SIGKILL a long-lived component of the freshness benchmark mid-run and bring it back (issue 51, faults).

Each component is killed with its whole process session (the Connect server with its Python workers, the scheduler
with the LocalExecutor's workers and the tasks they run, the broker's JVM), as a lost machine or container would
lose them, and started again through the dev tooling on the same port and data: devtools' LocalServer.start for
the broker and the Connect server, the stack's own spawn for the scheduler (the rest of Airflow keeps running).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Protocol, Sequence

from benchmarks.freshness_watcher import Watcher
from devtools.processes import LocalServer

COMPONENTS = ("connect", "scheduler", "broker")


class Restartable(Protocol):
    name: str

    def kill(self) -> None: ...

    def start(self) -> None:
        """Returns once the component serves again."""


def sigkill_session(process: subprocess.Popen) -> None:
    """SIGKILL the process's session (started with start_new_session): nothing of it runs a shutdown hook."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


class ServerComponent:
    """A devtools server (LocalKafkaBroker, LocalSparkConnectServer): its start() reuses its port and data folder."""

    def __init__(self, name: str, server: LocalServer) -> None:
        self.name, self.server = name, server

    def kill(self) -> None:
        if self.server.process is not None:
            sigkill_session(self.server.process)
            self.server.process = None

    def start(self) -> None:
        self.server.start()


class ComponentStack(Protocol):
    def kill_component(self, name: str) -> None: ...

    def restart_component(self, name: str) -> None: ...


class AirflowComponent:
    """One process of the benchmark's Airflow (its DefaultsAirflowStack kills and restarts it alone)."""

    def __init__(self, name: str, stack: ComponentStack) -> None:
        self.name, self.stack = name, stack

    def kill(self) -> None:
        self.stack.kill_component(self.name)

    def start(self) -> None:
        self.stack.restart_component(self.name)


def fault_offsets(count: int, seconds: float) -> list[float]:
    """Evenly spaced moments in a run of `seconds`: 1/4, 2/4, 3/4 of it for three faults."""
    return [seconds * (i + 1) / (count + 1) for i in range(count)]


@dataclass
class Fault:
    component: str
    at: float  # planned, s from the producer's start
    killed: float | None = None  # s from the producer's start
    returned: float | None = None  # s from the producer's start: the component serves again
    recovery_s: float | None = None  # filled in after the run (freshness_series.recovery_seconds)

    @property
    def down_s(self) -> float | None:
        return None if self.killed is None or self.returned is None else self.returned - self.killed


class FaultInjector(Watcher):
    """Kills each component at its offset from `started_at` (epoch s, the producer's start) and restarts it."""

    what = "a fault's kill or restart"
    stop_timeout = 300.0  # a restart under way finishes first

    def __init__(self, components: Sequence[Restartable], seconds: float) -> None:
        super().__init__("faults")
        self.components = list(components)
        self.faults = [Fault(c.name, at) for c, at in zip(self.components, fault_offsets(len(components), seconds))]

    def watch(self) -> None:
        for component, fault in zip(self.components, self.faults):
            if self.pause(self.started_at + fault.at - time.time()):
                return
            component.kill()
            fault.killed = time.time() - self.started_at
            print(f"fault: {component.name} SIGKILLed at {fault.killed:.0f} s", flush=True)
            component.start()
            fault.returned = time.time() - self.started_at
            print(f"fault: {component.name} back at {fault.returned:.0f} s (down {fault.down_s:.1f} s)", flush=True)
