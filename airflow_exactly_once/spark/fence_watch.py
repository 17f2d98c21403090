"""Stop a write attempt as soon as the ledger says it no longer owns its batch.

A submitted Spark job can outlive the Airflow task that started it (the task was killed,
or the driver runs on the cluster in cluster deploy mode). Fencing already keeps such an
orphan from committing anything: its `mark_prepared` fails once a newer attempt claimed
the batch. This watch makes it stop working too, so that it gives the cluster's cores
back to the attempt that replaced it instead of finishing a write nobody will use.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from airflow_exactly_once.core.errors import FencedError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.states import BatchState

log = logging.getLogger(__name__)


class FenceWatch:
    """Polls the batch row; calls `on_fenced(reason)` once if another attempt or run took it over."""

    def __init__(self, ledger: Ledger, batch_id: BatchId, on_fenced: Callable[[str], None],
                 interval: float = 2.0) -> None:
        self.ledger = ledger
        self.batch_id = batch_id
        self.on_fenced = on_fenced
        self.interval = interval
        self.reason: str | None = None
        self.epoch: int | None = None  # of the claim being watched
        self.checks = 0  # completed looks at the ledger
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, claimed: Batch) -> None:
        """Begin watching the batch as held by `claimed.epoch` (called right after the claim)."""
        self.epoch = claimed.epoch
        self._thread = threading.Thread(target=self._run, args=(claimed.epoch,), daemon=True,
                                        name=f"fence-watch {self.batch_id}")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval + 5)

    def check(self, epoch: int) -> str | None:
        """Why the attempt holding `epoch` is fenced, or None while it still owns the batch."""
        batch = self.ledger.get_batch(self.batch_id)
        if batch.state is BatchState.ABORTED:
            return f"batch {self.batch_id} was aborted meanwhile ({batch.error})"
        if batch.epoch != epoch:
            return (f"batch {self.batch_id} was claimed by a newer attempt (epoch {batch.epoch}, this attempt "
                    f"holds {epoch})")
        return None

    def _run(self, epoch: int) -> None:
        while not self._stop.wait(self.interval):
            try:
                reason = self.check(epoch)
            except Exception as exc:  # a ledger hiccup is no reason to stop a write
                log.warning("fence watch could not read batch %s: %s", self.batch_id, exc)
                continue
            finally:
                self.checks += 1
            if reason is not None:
                self.reason = reason
                log.error("fenced: %s; cancelling this attempt's Spark jobs", reason)
                self.on_fenced(reason)
                return

    def explain(self, exc: BaseException) -> BaseException:
        """The error to report for a write that failed: FencedError if it was fenced (cancelled by this watch,
        or failing because a newer attempt took its job over before the watch looked)."""
        if self.reason is None and self.epoch is not None:
            try:
                self.reason = self.check(self.epoch)
            except Exception:  # the ledger cannot be read: report the write's own error
                pass
        if self.reason is None:
            return exc
        return FencedError(f"this write attempt was stopped because {self.reason}; the attempt that replaced "
                           "it writes the batch")
