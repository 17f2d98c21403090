"""How the write task launches a batch's write, wherever it runs (docs/cluster.md).

One interface, three implementations side by side: in the task's own process (spark.launch.in_task),
on a Spark Connect server (spark.launch.connect), spark-submitted to a cluster (spark.launch.submit).
operators.write_launch chooses one from the write task's settings; the operator only starts it,
waits for its report and cancels it from on_kill. No Airflow here.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.spark.write_report import WriteReport


class Stopwatch:
    """A report's `seconds`: from the start, until a Spark session was there, and in all."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.session_s = 0.0

    def session_ready(self) -> None:
        self.session_s = time.monotonic() - self.started

    def seconds(self) -> dict[str, float]:
        return {"spark_session": round(self.session_s, 3), "total": round(time.monotonic() - self.started, 3)}


class WriteLauncher(ABC):
    """One write attempt of one batch. `start`, then `wait`; `cancel` may come at any time, from another thread
    or a signal handler (the task's on_kill, or a fence watch that saw a newer attempt take the batch)."""

    @abstractmethod
    def start(self, batch_id: BatchId) -> None:
        """Begin the write of the batch: get Spark (a session, or the submission ready); what fails here fails
        before any data is read."""

    @abstractmethod
    def wait(self) -> WriteReport:
        """Until the write ended: its report, or the error it failed with (an ExactlyOnceError's `retriable`
        says whether a retry can help). The claim, the staging and PREPARED happen in here (spark.write_job)."""

    @abstractmethod
    def cancel(self) -> None:
        """Stop what this attempt runs; the ledger fences it anyway, this gives the cores back."""

    def run(self, batch_id: BatchId) -> WriteReport:
        self.start(batch_id)
        return self.wait()
