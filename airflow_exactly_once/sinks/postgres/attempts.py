"""The prepared transactions of a pipeline's write attempts: whose they are, and which can no longer be committed.

GIDs are `aeo.<pipeline>.b<batch_seq>.p<partition>.a<epoch>`: the epoch of the write attempt
(the ledger's claim) tells the live attempt from dead ones. Prepared transactions of attempts
that were fenced, killed or aborted are rolled back on the next write, commit or abort of the
pipeline, so none is left behind; both the sink's writer and its committer do it.
"""

from __future__ import annotations

import logging
import re

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.sinks.postgres.commit import rollback_prepared_matching
from airflow_exactly_once.sinks.postgres.errors import PostgresTransactionError
from airflow_exactly_once.sinks.postgres.gids import gid_prefix
from airflow_exactly_once.sinks.postgres.table import PostgresTable

log = logging.getLogger(__name__)

_GID_TAIL = re.compile(r"^b(\d+)\.p(\d+)\.a(\d+)$")


def parse_gid(pipeline_id: str, gid: str) -> tuple[int, int, int] | None:
    """(batch_seq, partition, attempt) of one of this pipeline's gids, else None."""
    prefix = gid_prefix(pipeline_id)
    match = _GID_TAIL.match(gid[len(prefix):]) if gid.startswith(prefix) else None
    return None if match is None else tuple(int(g) for g in match.groups())  # type: ignore[return-value]


class PreparedAttempts:
    """The prepared transactions one table's sink left for a pipeline (None: a sink used without one)."""

    def __init__(self, table: PostgresTable, pipeline: PipelineConfig | None) -> None:
        self.table = table
        self.pipeline = pipeline

    def owner(self, batch: Batch) -> str:
        """The name in this sink's gids and marker rows: the pipeline's, or the dead-letter table's."""
        return self.table.transaction_name or batch.pipeline_id

    def rollback_dead(self, batch: Batch, keep=(), keep_epoch: int | None = None) -> list[str]:
        """Roll back this pipeline's prepared gids that can no longer be committed.

        Dead are: gids of this batch not in `keep` and not of the live attempt `keep_epoch`, and,
        in range_mode "continuation", gids of older batches (by the time a batch is written or
        committed, every older batch is COMMITTED or ABORTED: the plan step commits PREPARED
        batches first). Batches of other data intervals ("interval") may be PREPARED at the same
        time, so there only this batch's are touched; an older batch's are rolled back by its
        own commit or abort. Gids of newer batches are never touched.
        """
        older_are_done = self.pipeline is None or self.pipeline.range_mode == "continuation"

        def dead(gid: str) -> bool:
            parsed = parse_gid(self.owner(batch), gid)
            if parsed is None:
                return False
            seq, _, epoch = parsed
            return (older_are_done and seq < batch.seq) or (seq == batch.seq and gid not in keep
                                                             and epoch != keep_epoch)

        rolled_back = rollback_prepared_matching(self.table.dsn, gid_prefix(self.owner(batch)), dead)
        if rolled_back:
            log.info("rolled back %d prepared transaction(s) of dead attempts: %s", len(rolled_back), rolled_back)
        return rolled_back

    def rollback_attempt(self, batch: Batch, epoch: int) -> None:
        """After a failed write, what this attempt's partitions prepared before the failure."""
        def of_this_attempt(gid: str) -> bool:
            parsed = parse_gid(self.owner(batch), gid)
            return parsed is not None and parsed[2] == epoch

        try:
            rollback_prepared_matching(self.table.dsn, gid_prefix(self.owner(batch), batch.seq), of_this_attempt)
        except PostgresTransactionError as exc:
            log.warning("could not roll back this attempt's prepared transactions (%s); the next write, commit "
                        "or abort of the pipeline does", exc)
