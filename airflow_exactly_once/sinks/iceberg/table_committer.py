"""One table's committer behind the Iceberg sink's (sinks.iceberg.sink_committer): publish, drop and withdraw
batches with pyiceberg, no Spark.

Every change is one Iceberg commit guarded by a compare-and-set on main's head (pyiceberg's
AssertRefSnapshotId requirement, checked by the catalog in the same SQL transaction that
swaps the metadata pointer). When another writer moved main meanwhile, the commit fails,
the table is read again and the decision is taken again from scratch, so a racing commit of
the same batch finds it published and does nothing.

Files go only after the metadata that referenced them: a crash in between leaves orphan
files (Iceberg's remove_orphan_files finds them), never a snapshot that points at nothing.

A commit whose outcome is unknown (a REST catalog applied it, but its answer was lost: the
server killed, the connection dropped, a timeout, a 5xx) raises CommitOutcomeUnknown and deletes
nothing (Iceberg's issue #13867: cleaning up after such a commit deleted files the table used).
Every decision is taken again from the table as the catalog has it, so the retry finds the
batch in main's history when the commit landed, and publishes it otherwise.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar

from airflow_exactly_once.core.errors import ExactlyOnceError, SinkError, TransactionLostError
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.sinks.optimistic_commit import commit_with_retries
from airflow_exactly_once.sinks.iceberg import snapshots as snaps
from airflow_exactly_once.sinks.iceberg.catalog import CatalogSpec, catalog_failure, rest_failure, unreachable
from airflow_exactly_once.sinks.iceberg.committable import StagedSnapshot

log = logging.getLogger(__name__)

T = TypeVar("T")


class TableGone(SinkError):
    """The table is not in the catalog (dropped, or renamed)."""


def view(snapshot: Any) -> snaps.SnapshotView:
    summary = snapshot.summary
    props = dict(summary.additional_properties) if summary is not None else {}
    return snaps.SnapshotView(snapshot.snapshot_id, snapshot.parent_snapshot_id, props)


class TableCommitter:
    """Publish / drop / withdraw the batches of one pipeline in one table."""

    def __init__(self, catalog: CatalogSpec, table: str) -> None:
        self.catalog_spec = catalog
        self.table_name = table
        self._catalog: Any = None

    # -- reading the table ---------------------------------------------------------

    def catalog(self) -> Any:
        if self._catalog is None:
            self._catalog = self.catalog_spec.load()
        return self._catalog

    def load(self) -> Any:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog().load_table(self.table_name)
        except NoSuchTableError as exc:
            raise TableGone(f"table {self.table_name} does not exist in the Iceberg {self.catalog_spec.describe()}"
                            ) from exc
        except ExactlyOnceError:
            raise
        except Exception as exc:
            raise catalog_failure(self.catalog_spec, exc, table=self.table_name) from exc

    def exists(self) -> bool:
        try:
            self.load()
        except TableGone:
            return False
        return True

    @staticmethod
    def main_history(table: Any) -> list[snaps.SnapshotView]:
        from pyiceberg.table.snapshots import ancestors_of

        return [view(s) for s in ancestors_of(table.current_snapshot(), table.metadata)]

    @staticmethod
    def ref_heads(table: Any) -> set[int]:
        return {ref.snapshot_id for ref in table.metadata.refs.values()}

    @staticmethod
    def added_files(table: Any, snapshot: Any) -> list[Any]:
        """The data files `snapshot` added (what a batch wrote)."""
        from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

        files = []
        for manifest in snapshot.manifests(table.io):
            if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id:
                    files.append(entry.data_file)
        return files

    @staticmethod
    def live_files(table: Any) -> dict[str, Any]:
        """The data files main reads now, by path."""
        from pyiceberg.manifest import ManifestContent

        current = table.current_snapshot()
        if current is None:
            return {}
        return {entry.data_file.file_path: entry.data_file
                for manifest in current.manifests(table.io) if manifest.content == ManifestContent.DATA
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)}

    # -- the retry frame -----------------------------------------------------------

    def _with_retries(self, what: str, step: Callable[[Any], T]) -> T:
        """Run `step(table)` on a freshly loaded table until its commit is not beaten by another writer."""
        from pyiceberg.exceptions import CommitFailedException

        return commit_with_retries(what, self.load, step, beaten=CommitFailedException,
                                   where=f"main of {self.table_name}", explain=lambda exc: self._explain(exc, what))

    def _explain(self, exc: Exception, what: str) -> Exception | None:
        """The catalog's failure as the error that says what to do; None: raise it as it is (a ValueError too)."""
        if isinstance(exc, ValueError):
            return None
        if "OperationalError" in type(exc).__name__ or "InterfaceError" in type(exc).__name__:
            return unreachable(self.catalog_spec, exc)
        # a REST commit's request that failed may have been applied: CommitOutcomeUnknown, nothing deleted
        return rest_failure(self.catalog_spec, exc, self.table_name, committing=what)

    # -- publish -------------------------------------------------------------------

    def publish(self, batch: Batch, staged: StagedSnapshot, replaced: Batch | None = None) -> str:
        """Make the staged snapshot part of main (replacing `replaced`'s rows in the same snapshot). Idempotent."""
        key = snaps.batch_key(batch.pipeline_id, batch.seq)

        def step(table: Any) -> str:
            history = self.main_history(table)
            done = snaps.find_published(history, key)
            if done is not None:
                return f"batch {key} was already published to main of {self.table_name} (snapshot {done.snapshot_id})"
            if staged.snapshot_id is None:
                return f"batch {key} wrote no rows; nothing to publish"
            snapshot = table.metadata.snapshot_by_id(staged.snapshot_id)
            if snapshot is None:
                raise TransactionLostError(
                    f"the staged snapshot {staged.snapshot_id} of batch {key} is no longer in table "
                    f"{self.table_name} (expired by snapshot maintenance, or the table was recreated) and was never "
                    "published; keep staged snapshots longer than a batch takes to commit",
                    sink="iceberg", batch=batch.seq, lost=[f"snapshot {staged.snapshot_id}"],
                    reason="the staged snapshot expired or the table was recreated")
            main_head = history[0].snapshot_id if history else None
            summary = {**snaps.batch_summary(batch.pipeline_id, batch.seq, batch.epoch, batch.run_id),
                       snaps.SOURCE: str(staged.snapshot_id)}
            withdrawn = self._live_batch_files(table, history, replaced) if replaced is not None else []
            if not withdrawn and snaps.publish_mode(snapshot.parent_snapshot_id, main_head) == snaps.FAST_FORWARD:
                table.manage_snapshots().set_current_snapshot(snapshot_id=staged.snapshot_id).commit()
                return f"published batch {key} to main of {self.table_name} (fast-forward to {staged.snapshot_id})"
            files = self.added_files(table, snapshot)
            if replaced is not None:
                summary[snaps.REPLACES] = snaps.batch_key(replaced.pipeline_id, replaced.seq)
            with table.transaction() as tx:
                update = tx.update_snapshot(snapshot_properties=summary)
                with (update.overwrite() if withdrawn else update.fast_append()) as producer:
                    for data_file in withdrawn:
                        producer.delete_data_file(data_file)
                    for data_file in files:
                        producer.append_data_file(data_file)
            how = (f"replacing batch {replaced.seq}'s {len(withdrawn)} file(s)" if withdrawn and replaced is not None
                   else "cherry-pick")
            return f"published batch {key} to main of {self.table_name} ({how}: {len(files)} file(s))"

        try:
            return self._with_retries(f"publishing batch {key}", step)
        except TableGone as exc:
            raise TransactionLostError(
                f"{exc}: it was dropped after batch {key} was staged, and its staged snapshot went with it. "
                "Recreate the table (or give the sink 'create_table': True) before the next run",
                sink="iceberg", batch=batch.seq, lost=[f"snapshot {staged.snapshot_id}"],
                reason="the table was dropped") from exc

    # -- withdraw (retract) --------------------------------------------------------

    def _live_batch_files(self, table: Any, history: list[snaps.SnapshotView], batch: Batch) -> list[Any]:
        """The files `batch` published that main still reads; SinkError when only some of them are."""
        key = snaps.batch_key(batch.pipeline_id, batch.seq)
        published = snaps.find_published(history, key)
        if published is None:
            return []
        files = {f.file_path: f for f in self.added_files(table, table.metadata.snapshot_by_id(published.snapshot_id))}
        live = self.live_files(table)
        decision = snaps.withdrawal(set(files), set(live))
        if decision == "partial":
            raise SinkError(f"batch {key}'s files in {self.table_name} were rewritten since it was published (e.g. by "
                            "compaction), so its rows can no longer be withdrawn exactly; use interval_rerun='noop' or "
                            "rewind with --output keep", retriable=False)
        return [live[path] for path in files] if decision == "all" else []

    def withdraw(self, batch: Batch) -> str:
        """Remove the rows `batch` published from main, in one snapshot. Idempotent."""
        key = snaps.batch_key(batch.pipeline_id, batch.seq)

        def step(table: Any) -> str:
            files = self._live_batch_files(table, self.main_history(table), batch)
            if not files:
                return f"batch {key} has nothing in main of {self.table_name} (withdrawn before, or never published)"
            with table.transaction() as tx:
                with tx.update_snapshot(snapshot_properties={snaps.RETRACTS: key,
                                                             snaps.PIPELINE: batch.pipeline_id}).overwrite() as op:
                    for data_file in files:
                        op.delete_data_file(data_file)
            return f"withdrew batch {key} from main of {self.table_name} ({len(files)} file(s))"

        try:
            return self._with_retries(f"withdrawing batch {key}", step)
        except TableGone as exc:
            return f"{exc}; nothing to withdraw"

    # -- drop staged snapshots -----------------------------------------------------

    def drop_staged(self, batch: Batch, only: int | None = None) -> int:
        """Drop staged snapshots: `only` that one, else every attempt of `batch`, plus zombie attempts of batches
        already published. Their files go too unless their batch is published (a cherry-pick shares them)."""
        key = snaps.batch_key(batch.pipeline_id, batch.seq)

        def step(table: Any) -> tuple[list[Any], set[str]]:
            history = self.main_history(table)
            published = {s.batch for s in history if s.batch}
            candidates = snaps.leftovers((view(s) for s in table.metadata.snapshots), {s.snapshot_id for s in history},
                                         self.ref_heads(table), batch.pipeline_id, {key}, published)
            if only is not None:
                candidates = [c for c in candidates if c == only]
            if not candidates:
                return [], published
            dropped = [table.metadata.snapshot_by_id(c) for c in candidates]
            table.maintenance.expire_snapshots().by_ids(candidates).commit()
            return dropped, published

        try:
            dropped, published = self._with_retries(f"dropping staged snapshots of batch {key}", step)
        except TableGone:
            return 0
        table = self.load()
        for snapshot in dropped:
            self._delete_files(table, snapshot, data=view(snapshot).batch not in published)
        return len(dropped)

    def _delete_files(self, table: Any, snapshot: Any, data: bool) -> None:
        """The files only a dropped staged snapshot referenced: its data files (unless published), manifests, list."""
        try:
            paths = [f.file_path for f in self.added_files(table, snapshot)] if data else []
            paths += [m.manifest_path for m in snapshot.manifests(table.io)
                      if m.added_snapshot_id == snapshot.snapshot_id]
            paths.append(snapshot.manifest_list)
        except FileNotFoundError:
            return  # deleted by an earlier, interrupted drop
        for path in paths:
            try:
                table.io.delete(path)
            except FileNotFoundError:
                pass
            except OSError as exc:  # an orphan file is harmless: remove_orphan_files finds it
                log.warning("could not delete %s: %s", path, exc)
