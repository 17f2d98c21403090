"""Whether a write attempt still holds its batch, asked by a partition writer wherever it runs.

A write task that dies can leave its job running (on a Spark Connect server, on a cluster).
The ledger fences such a zombie when it tries to become PREPARED, but its writers could still
open a Kafka transaction or prepare a PostgreSQL transaction after the batch was aborted and
released, which would then hold a topic's last stable offset or a table's locks. A writer
asks the ledger right before it makes anything durable: a batch that is no longer PLANNED at
the attempt's epoch is not written.

Read-only and best effort about reachability: where the executors cannot reach the ledger
(a SQLite file on another host, a firewalled database) the writer logs that and writes; the
fencing of abort (Kafka: a new epoch per transactional id) and recovery still hold then.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from airflow_exactly_once.core.errors import FencedError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.states import BatchState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClaimCheck:
    """Picklable: travels with the partition writers to the executors."""

    ledger_url: str
    batch_id: BatchId
    epoch: int

    def ensure(self, doing: str) -> None:
        """Raise FencedError if the attempt no longer holds the batch; `doing` names what it was about to do."""
        try:
            ledger = Ledger.read_only(self.ledger_url)
            try:
                batch = ledger.get_batch(self.batch_id)
            finally:
                ledger.engine.dispose()
        except Exception as exc:  # unreachable from here: the abort's fencing and recovery still hold
            log.warning("cannot read the ledger from this executor to check batch %s before %s (%s); writing "
                        "without the check", self.batch_id, doing, exc)
            return
        if batch.state is not BatchState.PLANNED or batch.epoch != self.epoch:
            raise FencedError(f"not {doing}: batch {self.batch_id} is {batch.state.value} at epoch {batch.epoch}, "
                              f"this write attempt holds epoch {self.epoch} (it was aborted or taken over)")
