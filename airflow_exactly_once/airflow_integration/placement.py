"""Where a task runs: whether the executor it runs under may put a pipeline's tasks on several machines, and what of
the pipeline is then on one machine only.

Two things are: the embedded SQLite ledger (an error, hooks/ledger.py) and a sink folder that is a local path (a
warning, here: a folder every worker mounts is a valid setup that no setting can tell apart from a local disk). A
write stages files that notify_complete publishes, and later batches add to them; on another worker those files are
not there. The executor comes from the task's own `executor=`, else Airflow's `[core] executor`
(airflow_exactly_once.airflow_integration.executors decides, from the names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from airflow_exactly_once.airflow_integration.compat import configured_executors_setting
from airflow_exactly_once.airflow_integration.executors import ExecutorEntry, task_executor


class LocalFolderWarning(UserWarning):
    """A sink folder that is a local path where the pipeline's tasks may run on several machines."""


@dataclass(frozen=True)
class SeveralMachines:
    """An executor that may run a pipeline's tasks on several machines, and where the task's executor came from."""

    executor: ExecutorEntry
    source: str  # "the task's executor='celery'" or "[core] executor = 'CeleryExecutor'"

    def __str__(self) -> str:
        return f"executor {self.executor} ({self.source})"


def several_machines(executor: str | None = None) -> SeveralMachines | None:
    """The executor a task with `executor=` (None: Airflow's default) runs under, when it may put the pipeline's tasks
    on several machines; None when it keeps them on one. Reads only Airflow's configuration."""
    setting = configured_executors_setting()
    entry = task_executor(executor, setting)
    if entry.runs_on_one_machine:
        return None
    source = f"the task's executor={executor.strip()!r}" if executor and executor.strip() else \
        f"[core] executor = {setting!r}"
    return SeveralMachines(entry, source)


def local_folder_problems(folders: Sequence[tuple[str, str, str]], executor: str | None = None) -> list[str]:
    """Why each local folder may not be seen by the pipeline's other tasks; empty when there is none, or the executor
    keeps every task on one machine. `folders`: (where, value, what to use instead), as the sinks name them
    (sinks.spec_local_folders), so that this module knows Airflow's executors and nothing of the sinks."""
    where = several_machines(executor) if folders else None
    if where is None:
        return []
    return [f"{what} {value!r} is a local path, and {where} may run the pipeline's tasks on several machines: a task "
            "on another worker cannot see the files an earlier task left there (a write's staged files, the "
            "published batches); right only if every worker mounts that folder at this path, else use "
            f"{instead}" for what, value, instead in folders]
