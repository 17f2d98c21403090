"""The commits behind the Delta sink's committer (sinks.delta.sink_committer): publish, drop and withdraw batches
with delta-rs, no Spark. What the table holds of a batch, which these decide from, is read by sinks.delta.batch_state.

Every change is one Delta commit (one new table version). A publish carries the batch's
application transaction (sinks.delta.commits.app_id): Delta's optimistic concurrency refuses a
second commit of the same transaction that raced this one, and a commit replayed after a crash
finds it in the table and adds nothing. Other writers' appends do not conflict with ours:
delta-rs rebases a blind append onto them by itself. Staged files are added where they lie;
a folder goes only when no commit references it (other attempts' folders, aborted batches), or, for a
withdrawn batch, once the commit that removed its files is older than the table's retention
(sinks.delta.withdrawn).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, TypeVar

from airflow_exactly_once.core.errors import ExactlyOnceError, SinkError, TransactionLostError
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.sinks.optimistic_commit import commit_with_retries
from airflow_exactly_once.sinks.delta import batch_state, commits
from airflow_exactly_once.sinks.delta.committable import StagedFile, StagedFiles
from airflow_exactly_once.sinks.delta.folder import LocalFolder
from airflow_exactly_once.sinks.delta.stats import local_staged_file
from airflow_exactly_once.sinks.delta.target import DeltaTarget, TableMissing, deltalake
from airflow_exactly_once.sinks.delta.withdrawn import WithdrawnFolders

log = logging.getLogger(__name__)

T = TypeVar("T")


class TableCommits:
    """Publish / drop / withdraw the batches of one pipeline in one Delta table."""

    def __init__(self, target: DeltaTarget) -> None:
        self.target = target

    # -- the retry frame -----------------------------------------------------------

    def _with_retries(self, what: str, step: Callable[[Any], T]) -> T:
        """Run `step(table)` on a freshly loaded table until its commit is not beaten by a conflicting one."""
        return commit_with_retries(what, self.target.load, step, beaten=deltalake().exceptions.CommitFailedError,
                                   where=str(self.target.root))

    def _commit(self, table: Any, actions: list[Any], metadata: dict[str, str], app: str | None = None,
                version: int = 0) -> None:
        transaction = deltalake().transaction
        properties = transaction.CommitProperties(
            custom_metadata=metadata, app_transactions=[transaction.Transaction(app, version)] if app else None)
        table.create_write_transaction(actions, mode="append", schema=table.schema(),
                                       partition_by=table.metadata().partition_columns or None,
                                       commit_properties=properties)

    @staticmethod
    def _add(entry: StagedFile) -> Any:
        """The add action of one staged file: its size, partition values and statistics, as its writer saw them."""
        return deltalake().transaction.AddAction(entry.path, entry.size, dict(entry.partition_values),
                                                 entry.modified_ms, True, entry.stats)

    def _entries(self, staged: StagedFiles, partitions: list[str]) -> tuple[StagedFile, ...]:
        """The staged files' descriptions: the committable's, or (a committable staged before they were kept, on a
        local disk) from their footers."""
        if staged.entries or not staged.files:
            return staged.entries
        folder = self.target.folder
        if not isinstance(folder, LocalFolder):
            raise SinkError(f"the committable of {staged.folder} lists no file statistics", retriable=False)
        return tuple(local_staged_file(folder.root, f, staged.folder, partitions) for f in staged.files)

    # -- publish -------------------------------------------------------------------

    def publish(self, batch: Batch, staged: StagedFiles, replaced: Batch | None = None,
                replaced_files: tuple[str, ...] = ()) -> str:
        """Add the staged files in one commit carrying the batch's transaction (removing `replaced`'s files in the
        same commit). Idempotent."""
        key = commits.batch_key(batch.pipeline_id, batch.seq)

        def step(table: Any) -> str:
            done = batch_state.published_attempt(table, batch)
            if done is not None:
                if replaced is not None:  # replaced by that commit: its marker may not have been written yet
                    self._mark_withdrawn(table, replaced)
                return f"batch {key} was already published to {self.target.root} (attempt e{done})"
            withdrawn = self._removals(table, replaced, replaced_files) if replaced is not None else []
            if not staged.files and not withdrawn:
                return f"batch {key} wrote no rows; nothing to publish"
            missing = batch_state.missing_files(self.target.folder, staged)
            if missing:
                raise TransactionLostError(
                    f"{len(missing)} staged file(s) of batch {key} are gone from {self.target.root} (e.g. "
                    f"{missing[0]}) and the batch was never published", sink="delta", batch=batch.seq,
                    lost=missing, reason="its staged files were removed")
            partitions = list(table.metadata().partition_columns)
            adds = [self._add(entry) for entry in self._entries(staged, partitions)]
            metadata = commits.commit_metadata(batch.pipeline_id, batch.seq, batch.epoch, batch.run_id)
            if replaced is not None:
                metadata[commits.REPLACES] = commits.batch_key(replaced.pipeline_id, replaced.seq)
            self._commit(table, [*withdrawn, *adds], metadata, commits.app_id(batch.pipeline_id, batch.seq),
                         batch.epoch)
            if replaced is not None:
                self._withdrawn(replaced).mark(commits.folder_of(a.path, replaced.pipeline_id, replaced.seq)
                                               for a in withdrawn)
            how = f", removing batch {replaced.seq}'s {len(withdrawn)} file(s)" if replaced is not None else ""
            return f"published batch {key} to {self.target.root} ({len(adds)} file(s){how})"

        try:
            return self._with_retries(f"publishing batch {key}", step)
        except TableMissing as exc:
            raise self._table_removed(batch, staged, exc) from exc

    @staticmethod
    def _table_removed(batch: Batch, staged: StagedFiles, exc: TableMissing) -> TransactionLostError:
        """A table removed between stage and commit took the staged files with it: the range goes back."""
        return TransactionLostError(f"{exc}: the table was removed after batch {batch.seq} was staged. Recreate it "
                                    "(or give the sink 'create_table': True) before the next run", sink="delta",
                                    batch=batch.seq, lost=list(staged.files), reason="the table was removed")

    # -- withdraw (retract) --------------------------------------------------------

    def _removals(self, table: Any, batch: Batch, files: tuple[str, ...]) -> list[Any]:
        """Remove actions of the files `batch` published that the table still reads (`files`: the batch's
        committable's, when known); SinkError when only some of them are live."""
        live = batch_state.live_files(table, batch)
        chosen = commits.withdrawable(set(files) or set(live), set(live))
        if chosen is None:
            raise SinkError(f"batch {batch.seq}'s files in {self.target.root} were rewritten since it was published "
                            "(e.g. by OPTIMIZE), so its rows can no longer be withdrawn exactly; use "
                            "interval_rerun='noop' or rewind with --output keep", retriable=False)
        if chosen and table.metadata().configuration.get("delta.appendOnly") == "true":
            raise SinkError(f"the Delta table {self.target.root} is append-only (delta.appendOnly=true): batch "
                            f"{batch.seq} cannot be withdrawn; use interval_rerun='noop' or rewind with --output keep",
                            retriable=False)
        now = int(time.time() * 1000)
        remove = deltalake().transaction.RemoveAction
        return [remove(path, True, now, live[path]["size_bytes"],
                       {k[len("partition."):]: v for k, v in live[path].items() if k.startswith("partition.")})
                for path in sorted(chosen)]

    def withdraw(self, batch: Batch, files: tuple[str, ...] = ()) -> str:
        """Remove the rows `batch` published, in one commit. Idempotent (its files stay for time travel)."""
        key = commits.batch_key(batch.pipeline_id, batch.seq)

        def step(table: Any) -> str:
            removals = self._removals(table, batch, files)
            if not removals:
                self._mark_withdrawn(table, batch)  # a crash may have come between the commit and its marker
                return f"batch {key} has nothing in {self.target.root} (withdrawn before, or never published)"
            self._commit(table, removals, {commits.RETRACTS: key, commits.PIPELINE: batch.pipeline_id})
            self._withdrawn(batch).mark(commits.folder_of(a.path, batch.pipeline_id, batch.seq) for a in removals)
            return f"withdrew batch {key} from {self.target.root} ({len(removals)} file(s))"

        try:
            return self._with_retries(f"withdrawing batch {key}", step)
        except TableMissing as exc:
            return f"{exc}; nothing to withdraw"

    # -- the folders of withdrawn batches ------------------------------------------

    def _withdrawn(self, batch: Batch) -> WithdrawnFolders:
        return WithdrawnFolders(self.target, batch.pipeline_id)

    def _mark_withdrawn(self, table: Any, batch: Batch) -> None:
        """Mark the folder that published `batch` when the table reads none of its files any more."""
        epoch = batch_state.published_attempt(table, batch)
        if epoch is not None and not batch_state.live_files(table, batch):
            self._withdrawn(batch).mark([commits.attempt_folder(batch.pipeline_id, batch.seq, epoch)])

    def delete_withdrawn(self, pipeline_id: str) -> str:
        """Delete the folders of the pipeline's batches withdrawn longer ago than the table's
        deletedFileRetentionDuration. Never fails the step that calls it (the batch is committed): what is left
        goes at a later commit."""
        try:
            deleted = WithdrawnFolders(self.target, pipeline_id).sweep()
        except (OSError, ExactlyOnceError, deltalake().exceptions.DeltaError) as exc:
            log.warning("the files of withdrawn batches in %s stay until a later commit: %s", self.target.root, exc)
            return ""
        return f"; deleted the staged files of {len(deleted)} batch(es) withdrawn before the table's " \
               f"{commits.RETENTION_PROPERTY}" if deleted else ""

    # -- staged folders ------------------------------------------------------------

    def drop_attempts(self, batch: Batch, only: str | None = None) -> int:
        """Remove staged folders of `batch`'s attempts (`only`: that one), never the folder a commit published."""
        try:
            published = batch_state.published_attempt(self.target.load(), batch)
        except TableMissing:
            published = None
        live = None if published is None else commits.attempt_folder(batch.pipeline_id, batch.seq, published)
        dropped = 0
        for folder in batch_state.attempt_folders(self.target.folder, batch):
            if folder == live or (only is not None and folder != only):
                continue
            self.target.folder.delete_tree(folder)
            dropped += 1
        return dropped
