"""The PostgreSQL sink's committer: true two-phase commit on the prepared transactions a batch left.

notify_complete (commit): `COMMIT PREPARED` for each gid of the batch's committable; a gid that
is gone is resolved by its marker row (committed before, or lost). Prepared transactions of
attempts that were fenced, killed or aborted are rolled back on the way (sinks.postgres.attempts).
"""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError, SinkError, TransactionLostError
from airflow_exactly_once.core.lineage_names import DatasetName, postgres_dataset
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.sinks.postgres.attempts import PreparedAttempts
from airflow_exactly_once.sinks.postgres.commit import commit_prepared, list_prepared, rollback_prepared
from airflow_exactly_once.sinks.postgres.committable import PostgresCommittable
from airflow_exactly_once.sinks.postgres.errors import PostgresTransactionError, TwoPhaseNotSupported
from airflow_exactly_once.sinks.postgres.gids import gid_prefix
from airflow_exactly_once.sinks.postgres.markers import ensure_marker_table, list_markers
from airflow_exactly_once.sinks.postgres.server import check_two_phase_supported
from airflow_exactly_once.sinks.postgres.spec import PostgresSpec
from airflow_exactly_once.sinks.postgres.table import PostgresTable


class PostgresSinkCommitter(SinkCommitter[PostgresCommittable]):
    spec_type = PostgresSpec
    committable_type = PostgresCommittable

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.table = PostgresTable(spec)

    @property
    def attempts(self) -> PreparedAttempts:
        return PreparedAttempts(self.table, self.pipeline)

    def lineage_dataset(self) -> DatasetName:
        return postgres_dataset(self.table.dsn, self.table.table)

    def check(self, pipeline_id: str) -> None:
        """Two-phase commit enabled, the table there, an upsert key unique; marker table created."""
        table = self.table
        try:
            check_two_phase_supported(table.dsn)
            table.create_if_missing()
            table.columns()
            table.upsert_key()
            ensure_marker_table(table.dsn, table.marker_schema)
        except TwoPhaseNotSupported as exc:
            raise ConfigurationError(str(exc)) from exc
        except PostgresTransactionError as exc:
            raise SinkError(f"postgres sink check failed: {exc}", retriable=exc.retriable) from exc

    def verify_staged(self, batch: Batch, committable: PostgresCommittable) -> None:
        try:
            self._prepared_gids(batch, list(committable.gids))
        except PostgresTransactionError as exc:
            raise SinkError(f"postgres sink check of batch {batch.seq}: {exc}", retriable=exc.retriable) from exc

    def commit(self, batch: Batch, committable: PostgresCommittable) -> str:
        """COMMIT PREPARED every gid; all-or-nothing when one is found lost before any commit."""
        gids, dsn, marker_schema = list(committable.gids), self.table.dsn, self.table.marker_schema
        try:
            prepared = self._prepared_gids(batch, gids)
            outcomes = [commit_prepared(dsn, g, marker_schema=marker_schema) for g in gids if g in prepared]
            orphans = self.attempts.rollback_dead(batch, keep=gids)
        except TransactionLostError as exc:  # found lost, or rolled back between our look and our commit
            self._prepared_gids(batch, gids)  # one committed already: "half committed", never replayed as lost
            raise exc.restated(str(exc), batch=batch.seq) from exc
        except PostgresTransactionError as exc:
            raise SinkError(f"postgres sink commit of batch {batch.seq}: {exc}", retriable=exc.retriable) from exc
        now = outcomes.count("committed")
        return (f"committed {len(gids)} prepared transaction(s) into {self.table.table} ({now} now, "
                f"{len(gids) - now} already){f'; rolled back {len(orphans)} orphan(s)' if orphans else ''}")

    def abort(self, batch: Batch, committable: PostgresCommittable | None) -> str:
        """Roll back `committable` (a fenced attempt's), or every attempt of the batch when None."""
        try:
            if committable is not None:
                results = [rollback_prepared(self.table.dsn, g, marker_schema=self.table.marker_schema)
                           for g in committable.gids]
                return f"rolled back {results.count('rolled-back')} prepared transaction(s) of this attempt"
            orphans = self.attempts.rollback_dead(batch, keep=())
        except PostgresTransactionError as exc:
            raise SinkError(f"postgres sink abort of batch {batch.seq}: {exc}", retriable=exc.retriable) from exc
        return f"rolled back {len(orphans)} prepared transaction(s) of batch {batch.seq}"

    def _prepared_gids(self, batch: Batch, gids: list[str]) -> set[str]:
        """Which of `gids` are still prepared; raises when one is neither prepared nor committed."""
        owner, dsn = self.attempts.owner(batch), self.table.dsn
        prepared = set(list_prepared(dsn, gid_prefix(owner, batch.seq)))
        committed = {m["gid"] for m in list_markers(dsn, owner, batch.seq, marker_schema=self.table.marker_schema)}
        lost = [g for g in gids if g not in prepared and g not in committed]
        if lost:
            self._on_lost(batch, gids, lost, committed)
        return prepared

    def _on_lost(self, batch: Batch, gids: list[str], lost: list[str], committed: set[str]) -> None:
        done = [g for g in gids if g in committed]
        if done:
            raise SinkError(
                f"batch {batch.seq} is half committed: {len(done)} of its prepared transactions were committed "
                f"but {lost} are gone without a marker row (rolled back outside this pipeline, e.g. by an "
                f"operator). Its rows in {self.table.table} are incomplete and cannot be completed; repair the table "
                "by hand (rows of the lost partitions are missing) before resuming the pipeline.")
        self.attempts.rollback_dead(batch, keep=())
        raise TransactionLostError(
            f"prepared transaction(s) {lost} of batch {batch.seq} are gone and were never committed (rolled back "
            f"by an operator or lost with the server's data); nothing of the batch was committed",
            sink=self.type_name, batch=batch.seq, lost=lost, reason="rolled back: neither prepared nor committed")
