"""A batch's Kafka transactions as the committer judges, commits and aborts them.

Before committing any, each transaction is described (open, committed, or ended by someone
else); one the broker no longer has is judged by reading its first record under
read_committed. A batch with an aborted transaction is lost as a whole, or, when part of it is
committed already, a partial commit left for a person to decide.
"""

from __future__ import annotations

import logging
from typing import Callable

from kafka import KafkaAdminClient

from airflow_exactly_once.core.errors import SinkError, TransactionLostError
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks.kafka import hanging, probe
from airflow_exactly_once.sinks.kafka.committable import PartitionReport
from airflow_exactly_once.sinks.kafka.end_txn import end_transactions
from airflow_exactly_once.sinks.kafka.live_cluster import LiveCluster
from airflow_exactly_once.sinks.kafka.output import KafkaOutput
from airflow_exactly_once.sinks.kafka.transaction_handle import TransactionHandle

log = logging.getLogger(__name__)

# What the broker says of a batch's transaction before committing.
OPEN, COMMITTED, ABORTED = "open", "committed", "aborted"


class BatchTransactions:
    """One commit's or abort's view of the output cluster: its settings, an admin client, and the producer ids the
    pipeline's ledger knows (`owners`, to say whose a transaction holding a partition back is)."""

    def __init__(self, output: KafkaOutput, settings: KafkaSettings, admin: KafkaAdminClient,
                 owners: Callable[[], dict[int, hanging.Owner]]) -> None:
        self.output = output
        self.settings = settings
        self.admin = admin
        self.owners = owners

    def states_before_commit(self, reports: list[PartitionReport]) -> dict[str, str]:
        """Open / committed / aborted per transaction, before committing any: a batch whose
        transactions partly timed out is then aborted as a whole instead of half committed."""
        started = [r for r in reports if r.held_transaction.started]
        status = {r.held_transaction.transactional_id: COMMITTED for r in reports if not r.held_transaction.started}
        try:
            seen = probe.transaction_states(self.admin, [r.held_transaction.transactional_id for r in started])
        except Exception as exc:  # e.g. no DESCRIBE permission: fall back to committing and judging failures
            log.warning("cannot describe the batch's transactions (%s); committing them without looking first", exc)
            seen = {}
        for report in started:
            handle = report.held_transaction
            state = seen.get(handle.transactional_id,
                             probe.TransactionState("Ongoing", handle.producer_id, handle.epoch))
            same = state is not None and (state.producer_id, state.epoch) == (handle.producer_id, handle.epoch)
            current = state.state if same and state is not None else None  # this very transaction's state
            if current == "Ongoing":
                status[handle.transactional_id] = OPEN
            elif current in ("PrepareCommit", "CompleteCommit"):
                status[handle.transactional_id] = COMMITTED
            else:  # ended by someone else (timeout, fencing) or forgotten: the output decides
                status[handle.transactional_id] = self.judge(report)
        return status

    def commit_all(self, reports: list[PartitionReport]) -> dict[str, str]:
        """Commit the open transactions together (EndTxn pipelined); committed or, for one the broker
        lost meanwhile, what its output says. Raises when Kafka refused or did not answer for any."""
        by_handle = {r.held_transaction: r for r in reports}
        answers = end_transactions(self.admin, list(by_handle), commit=True,
                                   timeout_ms=self.output.end_timeout_ms(self.settings))
        failed = [(h, e) for h, e in answers.items() if e is not None and not isinstance(e, TransactionLostError)]
        if failed:  # their outcome is unknown: a retry describes the batch again and decides
            handle, exc = failed[0]
            others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            raise self.output.failure(self.settings, exc, f"committing {handle.transactional_id!r}{others}",
                                      exc.retriable) from exc
        status = {}
        for handle, error in answers.items():
            if error is None:
                status[handle.transactional_id] = COMMITTED
            else:
                log.warning("%s; reading the output to see whether it was committed", error)
                status[handle.transactional_id] = self.judge(by_handle[handle])
        return status

    def judge(self, report: PartitionReport) -> str:
        """Committed or aborted, from the first record the transaction wrote (read_committed)."""
        if not report.first_offsets:
            return ABORTED  # records were sent but none acknowledged: nothing can be visible
        topic, partition, offset = report.first_offsets[0]
        try:
            visible = probe.record_visible(self.settings, topic, partition, offset)
        except LookupError as exc:
            raise SinkError(f"cannot tell whether transaction {report.transactional_id!r} was committed: {exc}. The "
                            "output was deleted by retention before the commit could be checked.") from exc
        if visible is None:
            raise SinkError(f"cannot tell yet whether transaction {report.transactional_id!r} was committed: the last "
                            f"stable offset of {topic}[{partition}] has not passed offset {offset}; "
                            f"{self.holders(topic, partition, offset)}; retrying later decides it",
                            retriable=True)
        return COMMITTED if visible else ABORTED

    def holders(self, topic: str, partition: int, offset: int) -> str:
        """Which open transactions hold a partition's last stable offset at or below `offset`, and whose.

        Asked through LiveCluster: a node that died under the commit is asked around, not reported as the cause."""
        def ask(admin: KafkaAdminClient) -> tuple[list[hanging.OpenTransaction], dict]:
            held = [t for t in hanging.open_transactions(admin, [(topic, partition)]) if t.start_offset <= offset]
            return held, hanging.coordinator_views(admin, self.settings, {t.producer_id for t in held}, {})

        live = LiveCluster(self.settings, self.admin)
        try:
            held, views = live.ask(f"asking what holds {topic}[{partition}] back", ask)
        except Exception as exc:  # noqa: BLE001 - only the message's detail: the wait's own error stands
            return f"which transaction holds it back cannot be asked ({type(exc).__name__}: {exc})"
        finally:
            live.close()
        if not held:
            return "no transaction holds it back any more"
        owners = self.owners()
        return "held back by " + "; ".join(
            f"{t.describe()}, {views[t.producer_id][0].describe()}, "
            + (f"this pipeline's batch {owners[t.producer_id].batch_seq}" if t.producer_id in owners
               else "not this pipeline's") for t in held)

    def lost(self, batch: Batch, reports: dict[str, PartitionReport], status: dict[str, str],
             aborted: list[str]) -> None:
        """Raise for a batch with aborted transactions: lost (its open ones aborted too), or partially committed."""
        timeout_ms = self.output.transaction_timeout_ms
        committed = sorted(t for t, s in status.items() if s == COMMITTED and reports[t].held_transaction.started)
        lost_records = sum(reports[t].records for t in aborted)
        if committed:
            raise SinkError(
                f"PARTIAL COMMIT of batch {batch.seq}: transactions {', '.join(committed)} are committed but "
                f"{', '.join(aborted)} ({lost_records} records) were aborted by the broker before notify_complete "
                f"could commit them (transaction_timeout_ms={timeout_ms}). Processing the range "
                "again would duplicate the committed part, so the batch is left PREPARED: decide by hand, and "
                "raise transaction_timeout_ms so that notify_complete always comes in time.")
        still_open = [reports[t].held_transaction for t, s in status.items() if s == OPEN]
        if still_open:
            answers = end_transactions(self.admin, still_open, commit=False,
                                       timeout_ms=self.output.end_timeout_ms(self.settings))
            for handle, exc in answers.items():
                if exc is not None and not isinstance(exc, TransactionLostError):  # never committed: it times out
                    log.warning("could not abort %s now (%s); it times out on its own", handle.transactional_id, exc)
        raise TransactionLostError(
            f"the Kafka transactions of batch {batch.seq} were aborted before notify_complete committed them "
            f"({', '.join(aborted)}: timed out after transaction_timeout_ms={timeout_ms}, or "
            f"fenced); read_committed consumers never saw their {lost_records} records",
            sink="kafka", batch=batch.seq, lost=aborted, reason="aborted by the broker before the commit")

    def abort_all(self, handles: list[TransactionHandle]) -> int:
        """Abort exactly these transactions (EndTxn pipelined); how many the broker confirmed. Raises the
        first refusal or unanswered abort once all were tried (the caller keeps the release pending)."""
        if not any(h.started for h in handles):
            return 0
        answers = end_transactions(self.admin, handles, commit=False,
                                   timeout_ms=self.output.end_timeout_ms(self.settings))
        for handle, exc in answers.items():
            if isinstance(exc, TransactionLostError):
                log.info("Nothing to abort for %s: %s", handle, exc.reason)
            elif exc is not None:
                raise exc
        return sum(1 for h, e in answers.items() if e is None and h.started)
