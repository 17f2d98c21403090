"""The two-phase commit of one batch, step by step, on top of the ledger and a sink's committer.

Flink's TwoPhaseCommitSinkFunction mapped onto Airflow tasks:
  plan            = initializeState (recover: commit PREPARED batches) + fix the range (core.planning)
  write           = snapshotState -> preCommit: `claim`, the sink stages, `prepare` (spark.write_job)
  notify_complete = notifyCheckpointComplete -> `commit`, then advance the offsets
  abort           = notifyCheckpointAborted -> `abort`
No Airflow and no Spark here: the operators and the Spark job call these methods.

Whenever a batch becomes ABORTED (abort, superseded by another run, its output found lost in
notify_complete or in recovery), everything its write attempts staged is taken away (`release`):
first the attempts' jobs are stopped (`stop_attempts`, given by the write path that can outlive
a task, e.g. a Spark Connect server), then the sink aborts every attempt's staged output. A
PLANNED batch is marked ABORTED first, with the release pending in the same transaction: the
ledger is what fences a zombie attempt, and a process that dies before the release finished
leaves it to the next run's recovery. A PREPARED batch whose output was lost is released first
and marked ABORTED after: dying in between leaves it PREPARED, and recovery finds it lost again.
"""

from __future__ import annotations

import logging
from typing import Callable

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import FencedError, SinkError, TransactionLostError
from airflow_exactly_once.core.faults import fault_point
from airflow_exactly_once.core.ledger import RELEASE_PENDING, Ledger, OpenWork
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.retention import AUTO_PRUNE_BATCHES, AUTO_PRUNE_MIN, Retention, prune
from airflow_exactly_once.core.rewind import finish_retractions
from airflow_exactly_once.core.sink import Committable
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.core.states import BatchState

log = logging.getLogger(__name__)

# Stops whatever earlier write attempts of a batch still run (their jobs on a server that outlives the
# task) and returns once they ended, or raises; returns what it did, for the log.
StopAttempts = Callable[[Batch], str]


class BatchCoordinator:
    """recover / claim / prepare / commit / abort of one pipeline's batches.

    It holds the commit side of the pipeline's sink only (`sink`, bound to the ledger's history); the
    write step stages with the sink's writer (spark.write_job) and hands its committable to `prepare`.
    """

    def __init__(self, config: PipelineConfig, ledger: Ledger, sink: SinkCommitter,
                 stop_attempts: StopAttempts | None = None) -> None:
        self.config = config
        self.ledger = ledger
        ledger.hide(config.secret_texts())  # no error or event it records holds one
        self.sink = sink.bind(config, history=self.staged_history, ledger=ledger)
        self.stop_attempts = stop_attempts
        self.recovered: list[BatchId] = []  # batches this coordinator committed by recovery
        self.recovery_lost: list[BatchId] = []  # batches recovery found lost (now ABORTED, processed again)

    @property
    def pipeline_id(self) -> str:
        return self.config.pipeline_id

    def staged_history(self) -> list[tuple[Batch, Committable]]:
        """Every batch of the pipeline whose committable the ledger still holds (core.sink.StagedHistory)."""
        return [(batch, committable) for batch in self.ledger.list_batches(self.pipeline_id)
                if (committable := self.sink.committable(batch.handles)) is not None]

    # -- recovery (the plan step, before anything new) ------------------------------

    def recover(self, batches: list[Batch] | None = None, work: OpenWork | None = None) -> list[str]:
        """Commit (or find lost) every PREPARED batch before anything new is planned.

        Also finishes retractions a rewind recorded but could not complete, so that no
        new batch rewrites a range whose old output is still visible. `work`: what the caller
        just read of the ledger (Ledger.open_work), read here when None; `batches`: the PREPARED
        batches to commit, by default those of `work`.
        """
        if work is None:
            work = self.ledger.open_work(self.pipeline_id)
        results = finish_retractions(self.ledger, self.sink, self.pipeline_id, work.retractions)
        results += self.release_aborted(work.releases)
        if batches is None:
            batches = work.prepared
        for batch in batches:
            log.info("recovery: %s was left PREPARED by run %s; committing it", batch.describe(), batch.run_id)
            try:
                results.append(self.commit(batch.id))
                self.recovered.append(batch.id)
                self.ledger.record_event(self.pipeline_id, batch.seq, "recovered",
                                         f"batch {batch.seq} of run {batch.run_id} was left PREPARED and was "
                                         "committed by recovery")
            except TransactionLostError as exc:
                log.warning("recovery: %s", exc)
                self.recovery_lost.append(batch.id)
                results.append(f"batch {batch.seq} lost and aborted")
                self.ledger.record_event(self.pipeline_id, batch.seq, "recovery-lost",
                                         f"batch {batch.seq} of run {batch.run_id} was left PREPARED and its "
                                         f"output was found lost; its range is processed again ({exc})")
        return results

    # -- write (the Spark job drives these two) ------------------------------------

    def past_write(self, batch_id: BatchId) -> BatchState | None:
        """None while the batch waits for its write; PREPARED or COMMITTED once it needs none. An ABORTED batch
        cannot be written by this run (FencedError). The one check of a batch's state before a write: `claim`
        makes it, and so does a write path that would otherwise start a Spark application for nothing."""
        batch = self.ledger.get_batch(batch_id)
        if batch.state in (BatchState.PREPARED, BatchState.COMMITTED):
            return batch.state
        if batch.state is BatchState.ABORTED:
            raise FencedError(f"batch {batch_id} was aborted ({batch.error}); this run cannot write it")
        return None

    def claim(self, batch_id: BatchId) -> Batch | None:
        """This write attempt takes the batch (a new epoch fences older attempts); None when it is past the write."""
        if self.past_write(batch_id) is not None:
            return None
        claimed = self.ledger.claim(batch_id)
        fault_point("write.before_stage")
        return claimed

    def prepare(self, batch: Batch, committable: Committable, input_records: int | None,
                output_records: int | None, details: dict | None = None) -> Batch:
        """The sink staged the output: record its committable, the batch is PREPARED (or this attempt fenced).

        `details` (e.g. the batch's bad-record counts) are kept with the batch in the same transaction.
        """
        fault_point("write.after_stage")
        handles = {**committable.to_handles(), "records": output_records}
        try:
            prepared = self.ledger.mark_prepared(batch.id, batch.epoch, handles, input_records, output_records,
                                                 details=details)
        except FencedError:
            log.warning("this write attempt was fenced; discarding its staged output")
            self.sink.abort(batch, committable)
            raise
        fault_point("write.after_prepare")
        return prepared

    # -- notify_complete / abort ---------------------------------------------------

    def commit(self, batch_id: BatchId) -> str:
        """Commit the sink, then (only then) advance the offsets. Safe to run again."""
        batch = self.ledger.get_batch(batch_id)
        if batch.state is BatchState.COMMITTED:
            return f"batch {batch_id} was already committed"
        if batch.state is BatchState.ABORTED:
            raise SinkError(f"batch {batch_id} was aborted ({batch.error}); its range is processed again by "
                            "the next run")
        if batch.state is BatchState.PLANNED:
            raise SinkError(f"batch {batch_id} is still PLANNED: its write did not finish, so there is nothing "
                            "to commit (run the write task first)")
        fault_point("notify.before_sink_commit")
        replaced = self._replaced_batch(batch)
        committable = self.sink.committable(batch.handles)
        if committable is None:
            raise SinkError(f"batch {batch_id} is PREPARED but the ledger holds no handles of its staged output, so "
                            "there is nothing to commit: a batch becomes PREPARED only with its committable's "
                            "handles; run the write task again after clearing it", retriable=False)
        try:
            if replaced is None:
                outcome = self.sink.commit(batch, committable)
            else:
                outcome = self.sink.commit_replacing(batch, committable, replaced)
        except TransactionLostError as exc:
            # What is left of the batch (dead letters, transactions that did not expire yet) must not hold a
            # topic or a table: released before the ledger says ABORTED (dying in between: recovery finds it lost).
            log.warning("batch %s lost its output (%s); releasing what is left of it: %s", batch_id, exc,
                        self.sink.abort(batch, committable))
            self.ledger.mark_aborted(batch_id, f"sink output lost: {exc}", from_state=BatchState.PREPARED)
            raise exc.restated(
                f"{exc}. Batch {batch_id} is now ABORTED and its range will be processed again by the next run.",
                batch=batch.seq) from exc
        fault_point("notify.after_sink_commit")
        changed = self.ledger.mark_committed(batch_id, retracts=[replaced.seq] if replaced is not None else [])
        bad = batch.bad_records
        if changed and bad and bad.policy == "skip":  # skipped records are recorded once, when they count
            first = ", ".join(f"{r['topic']}[{r['partition']}]@{r['offset']}" for r in bad.first)
            self.ledger.record_event(self.pipeline_id, batch.seq, "bad-records-skipped",
                                     f"{bad.count} bad record(s) skipped by bad_record_policy='skip' "
                                     f"(first: {first}); they are not in the output")
        fault_point("notify.after_ledger")
        return f"{outcome}; batch {batch_id} {'COMMITTED' if changed else 'was already COMMITTED'}"

    def retain(self) -> str | None:
        """After a commit: prune a bounded amount of the pipeline's history (core.retention), once enough may go.

        Never fails the step: the batch is committed, and whatever is left is pruned after a later commit
        (or by `airflow-exactly-once prune`). None when there was nothing to prune.
        """
        retention = Retention.of(self.config)
        try:
            report = prune(self.ledger, self.pipeline_id, retention, max_batches=AUTO_PRUNE_BATCHES,
                           min_batches=AUTO_PRUNE_MIN)
        except Exception as exc:  # noqa: BLE001 - retention is housekeeping; the commit stands
            log.warning("retention: pruning %s failed (%s); a later commit or `airflow-exactly-once prune` "
                        "does it", self.pipeline_id, exc)
            return None
        return " ".join(report.describe()) if report.pruned.batches else None

    def _replaced_batch(self, batch: Batch) -> Batch | None:
        """The committed batch whose output this one replaces (a re-run of a data interval)."""
        seq = batch.replaces
        if seq is None:
            return None
        old = self.ledger.get_batch(BatchId(self.pipeline_id, seq))
        # RETRACTED: an earlier attempt of this commit already swapped the output.
        return old if old.state in (BatchState.COMMITTED, BatchState.RETRACTED) else None

    def abort(self, batch_id: BatchId, reason: str) -> str:
        batch = self.ledger.get_batch(batch_id)
        if batch.state is BatchState.COMMITTED:
            return f"batch {batch_id} is COMMITTED; nothing to abort"
        if batch.state is BatchState.PREPARED:
            return (f"batch {batch_id} is PREPARED: its output is pre-committed and will be committed by "
                    "notify_complete or by the next run's recovery, so it is not aborted")
        if batch.state is BatchState.PLANNED:
            try:
                self.ledger.mark_aborted(batch_id, reason, release_pending=True)
            except FencedError:
                current = self.ledger.get_batch(batch_id)
                if current.state is BatchState.PREPARED:
                    return f"batch {batch_id} became PREPARED meanwhile; left for commit"
                if current.state is not BatchState.ABORTED:
                    raise
            batch = self.ledger.get_batch(batch_id)
        if not batch.details.get(RELEASE_PENDING):
            return f"batch {batch_id} was already ABORTED and released"
        released = self.release(batch)
        return (f"batch {batch_id} ABORTED and its staged output removed ({released}); the next run processes "
                "its range again")

    # -- releasing what ABORTED batches staged ----------------------------------------

    def release(self, batch: Batch) -> str:
        """Stop the ABORTED batch's attempts, then take away what every attempt staged. Idempotent.

        Raises (and leaves the release pending for the next recovery) when an attempt cannot be
        stopped: cleaning up under a job that still writes would leave its later output behind.
        """
        stopped = self.stop_attempts(batch) if self.stop_attempts is not None else None
        outcome = self.sink.abort(batch, None)
        self.ledger.update_details(batch.id, **{RELEASE_PENDING: None})
        return f"{stopped}; {outcome}" if stopped else outcome

    def release_aborted(self, pending: list[Batch] | None = None) -> list[str]:
        """Finish the releases that aborts, supersedes or dead processes left pending.

        `pending`: those batches as the caller just read them (Ledger.open_work); None reads them here.
        """
        results = []
        for batch in self.ledger.pending_releases(self.pipeline_id) if pending is None else pending:
            outcome = self.release(batch)
            log.info("recovery: released what ABORTED batch %s staged: %s", batch.seq, outcome)
            results.append(f"batch {batch.seq} released: {outcome}")
        return results
