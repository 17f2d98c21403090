"""Which Airflow executor a task runs under, and whether that executor keeps every task on one machine.

The embedded SQLite ledger is a file in AIRFLOW_HOME: safe only where every task of a pipeline
opens the same file. Executors that run tasks as processes of the scheduler's own machine do;
executors that hand tasks to workers, pods or containers (Celery, Kubernetes, ECS, Edge, ...)
do not, and an executor this module does not know is taken to be one of those. Pure logic on
the names as Airflow's `[core] executor` and a task's `executor=` write them: the Airflow-facing
side (hooks/ledger.py) reads both.
"""

from __future__ import annotations

from dataclasses import dataclass

# Class names of the executors that run every task on the scheduler's machine (Airflow's local executor, the
# sequential and debug executors of Airflow 2, Airflow's test executor).
ONE_MACHINE_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor", "DebugExecutor", "MockExecutor"})
# What Airflow runs when `[core] executor` is empty.
AIRFLOW_DEFAULT_EXECUTOR = "LocalExecutor"


@dataclass(frozen=True)
class ExecutorEntry:
    """One executor as configured: `CeleryExecutor`, `my.module.MyExecutor`, or `alias:my.module.MyExecutor`."""

    path: str  # a short name (CeleryExecutor) or a module path
    alias: str | None = None

    @classmethod
    def parse(cls, text: str) -> ExecutorEntry:
        alias, colon, path = text.strip().partition(":")
        return cls(path.strip(), alias.strip() or None) if colon else cls(alias.strip())

    @property
    def class_name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    def answers_to(self, name: str) -> bool:
        """Whether a task's `executor=name` means this entry (Airflow looks up aliases, module paths, class names)."""
        return name.strip() in (self.alias, self.path, self.class_name)

    @property
    def runs_on_one_machine(self) -> bool:
        return self.class_name in ONE_MACHINE_EXECUTORS

    def __str__(self) -> str:
        return f"{self.alias}:{self.path}" if self.alias else self.path


def configured_executors(setting: str | None) -> list[ExecutorEntry]:
    """The entries of `[core] executor`, the default (the first of the global list) first.

    The setting is a comma-separated list; Airflow's multi-team form adds `;team=A,B` lists, whose
    entries come after the global ones (a task may name them with its `executor=`).
    """
    entries: list[ExecutorEntry] = []
    for part in (setting or "").split(";"):
        names = part.partition("=")[2] if "=" in part else part
        entries += [ExecutorEntry.parse(name) for name in names.split(",") if name.strip()]
    return entries


def task_executor(own: str | None, setting: str | None) -> ExecutorEntry:
    """The executor a task runs under: its own `executor=` (an alias, short name or path of a configured
    executor, or a path of its own), else Airflow's default, the first of `[core] executor`."""
    entries = configured_executors(setting) or [ExecutorEntry(AIRFLOW_DEFAULT_EXECUTOR)]
    if own and own.strip():
        return next((entry for entry in entries if entry.answers_to(own)), ExecutorEntry.parse(own))
    return entries[0]
