"""The four steps of one exactly-once micro-batch as Airflow operators.

All of them take the same pipeline arguments (operators.arguments: one declaration, shared
by the task group) through `ExactlyOnceBaseOperator` (operators.base, exported here too); `__init__`
only stores them and every operator does its I/O in `execute`. XCom carries nothing but the batch id,
"<pipeline_id>:<batch_seq>".

Airflow imports this module with the DAG in every task, so what only one step needs is imported in that
step: kafka-python in plan (and in notify_complete for a mirrored consumer group), a Spark client in write
(operators.write_launch), OpenLineage's facets where that provider asks for them.
"""

from __future__ import annotations

import json
import time
from typing import Any, Sequence

from airflow_exactly_once.airflow_integration.assets import batch_event_extra, emit_batch_events
from airflow_exactly_once.airflow_integration.compat import AirflowSkipException
from airflow_exactly_once.core.errors import TransactionLostError
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.planning import PlanOutcome, plan_batch
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.timestamps import to_epoch_ms
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.operators.base import ExactlyOnceBaseOperator
from airflow_exactly_once.operators.txn_guardrail import check_commit_deadline
from airflow_exactly_once.operators.write_launch import check_write_packages, write_launcher
from airflow_exactly_once.spark.launch.launcher import WriteLauncher
from airflow_exactly_once.spark.write_report import WriteReport

__all__ = [
    "ExactlyOnceBaseOperator",
    "PlanBatchOperator",
    "WriteBatchOperator",
    "NotifyCompleteOperator",
    "AbortBatchOperator",
]


def _data_interval(context) -> tuple[int, int] | None:
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None:
        return None
    return to_epoch_ms(start), to_epoch_ms(end)


def _cleared_run_after(context) -> int | None:
    """When the run became due, epoch ms, if it was cleared since (its batch may have been pruned); else None."""
    dag_run = context.get("dag_run")
    if dag_run is None or not getattr(dag_run, "clear_number", 0) or getattr(dag_run, "run_after", None) is None:
        return None
    return to_epoch_ms(dag_run.run_after)


def _log_ranges(log, batch: Batch) -> None:
    for r in batch.ranges:
        log.info("  %s[%d] offsets %d..%d (%d offsets)", r.topic, r.partition, r.start, r.end, r.size)


class _BatchStepOperator(ExactlyOnceBaseOperator):
    """A step that works on the batch planned by the `plan` task of the same run.

    :param batch_id: The batch, "<pipeline_id>:<batch_seq>" (the task group pulls it from plan's XCom).
    """

    template_fields: Sequence[str] = (*ExactlyOnceBaseOperator.template_fields, "batch_id")

    def __init__(self, *, batch_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch_id = batch_id

    def resolved_batch_id(self) -> BatchId | None:
        """The rendered batch_id as a batch id; None when plan returned none (nothing was planned)."""
        text = (self.batch_id or "").strip()
        return None if text in ("", "None") else BatchId.parse(text)


class PlanBatchOperator(ExactlyOnceBaseOperator):
    """Recover PREPARED batches, then fix this run's offset range (or reuse the one it fixed).

    :param write_task_id: The pipeline's write task, whose retry settings the transaction-timeout check reads.
    :param notify_task_id: The pipeline's notify_complete task, likewise.
    """

    ui_color = "#cfe8ff"

    def __init__(self, *, write_task_id: str | None = None, notify_task_id: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.write_task_id = write_task_id
        self.notify_task_id = notify_task_id

    def run_step(self, context) -> str | None:
        from airflow_exactly_once.kafka.offsets import KafkaOffsetSource

        started = time.monotonic()
        coordinator = self.coordinator()
        # The ledger page shows a pipeline to the users who may read the DAGs that drive it.
        coordinator.ledger.record_dag(coordinator.pipeline_id, self.dag_id)
        check_commit_deadline(self, coordinator.sink, self.write_task_id, self.notify_task_id, self.log)
        # Before recovery and planning: a write that cannot start (no build of a sink's library for this Spark line).
        check_write_packages(coordinator.config, connect_url=self.spark_connect_url(), spark_conf=self.spark_conf)
        interval = _data_interval(context) if coordinator.config.range_mode == "interval" else None
        settings = KafkaSettings.of(coordinator.config)
        try:
            outcome = plan_batch(coordinator, lambda: KafkaOffsetSource(settings), context["run_id"], interval,
                                 _cleared_run_after(context))
        finally:  # what recovery did counts even when planning failed after it
            self._report_recovery(coordinator)
            self.record_lineage(None, coordinator.recovered)
        for batch_id in coordinator.recovered:
            recovered = coordinator.ledger.get_batch(batch_id)
            self.log.info("plan: recovery committed batch %s left PREPARED by run %s", batch_id, recovered.run_id)
            emit_batch_events(context, self.outlets, [batch_event_extra(
                recovered, coordinator.ledger.batch_interval(batch_id))])
        self.log.info("plan: %s", outcome.message)
        if outcome.batch is not None:
            _log_ranges(self.log, outcome.batch)
        self._report_plan(coordinator, outcome, time.monotonic() - started)
        self.record_lineage(outcome.batch.id if outcome.batch is not None else None, coordinator.recovered)
        if outcome.batch is None or not outcome.needs_commit:  # nothing to write: write and notify_complete skipped
            if coordinator.recovered:
                return None  # succeed, so that the recovered batches' Asset events are emitted
            raise AirflowSkipException(outcome.message)
        return str(outcome.batch.id)

    def _report_recovery(self, coordinator: BatchCoordinator) -> None:
        metrics = self.metrics
        with metrics.reporting("recovery"):
            for batch_id in coordinator.recovered:
                metrics.recovery("committed")
                metrics.committed(coordinator.ledger.get_batch(batch_id))
            if coordinator.recovery_lost:
                metrics.recovery("lost", len(coordinator.recovery_lost))
                metrics.abort("output_lost", len(coordinator.recovery_lost))

    def _report_plan(self, coordinator: BatchCoordinator, outcome: PlanOutcome, seconds: float) -> None:
        metrics = self.metrics
        with metrics.reporting("plan"):
            if outcome.superseded:
                metrics.abort("superseded", len(outcome.superseded))
            skipped = outcome.batch.skipped if outcome.batch is not None else ()
            if skipped and outcome.action in ("planned", "empty"):  # recorded by this plan, not an earlier one
                metrics.data_loss("skip", len(skipped))
            metrics.lag(outcome.lag)
        self.report_in_flight(coordinator)
        metrics.phase_duration("plan", seconds)


class WriteBatchOperator(_BatchStepOperator):
    """Run the Spark job: read exactly the planned range, transform, write pre-committed output.

    In-process (`local[*]`, or `spark_conf["spark.master"]`) by default; on a Spark Connect
    server with `spark_conn_id` of type `spark_connect` (or `spark_conf["spark.remote"]`);
    spark-submitted to a cluster with `spark_conn_id` of type `spark` (operators.write_launch chooses).
    """

    ui_color = "#ffe6c7"
    launcher: WriteLauncher | None = None  # the write running now, for on_kill

    def run_step(self, context) -> WriteReport:
        batch_id = self.resolved_batch_id()
        if batch_id is None:
            raise AirflowSkipException("no batch was planned in this run")
        self.record_lineage(batch_id)
        started = time.monotonic()
        self.launcher = write_launcher(self.coordinator, spark_conn_id=self.spark_conn_id,
                                       connect_url=self.spark_connect_url(), spark_conf=self.spark_conf,
                                       transform=self.transform, log=self.log,
                                       connect_session=self.spark_connect_session)
        try:
            report = self.launcher.run(batch_id)
        finally:
            self.launcher = None
        self.log.info("write: %s", json.dumps(report))
        if report.get("action") == "prepared":  # this attempt wrote the batch (not one found written already)
            self.metrics.phase_duration("write", time.monotonic() - started)
        return report

    def on_kill(self) -> None:
        if self.launcher is not None:
            self.launcher.cancel()


class NotifyCompleteOperator(_BatchStepOperator):
    """Commit the sink output, then advance the offsets (Flink's notifyCheckpointComplete)."""

    ui_color = "#d4f5d4"

    def run_step(self, context) -> str:
        batch_id = self.resolved_batch_id()
        if batch_id is None:
            raise AirflowSkipException("no batch was planned in this run")
        self.record_lineage(batch_id)
        started = time.monotonic()
        coordinator = self.coordinator()
        metrics = self.metrics
        before = coordinator.ledger.get_batch(batch_id).state
        try:
            message = coordinator.commit(batch_id)
        except TransactionLostError:
            metrics.abort("output_lost")
            raise
        finally:  # on every attempt, failed ones too: how close a PREPARED batch is to its deadline
            self.report_in_flight(coordinator)
        self.log.info("notify_complete: %s", message)
        batch = coordinator.ledger.get_batch(batch_id)
        self.log.info("notify_complete: batch %s committed %s records read, %s written", batch_id,
                      batch.input_records, batch.output_records)
        if before is BatchState.PREPARED and batch.state is BatchState.COMMITTED:  # this attempt committed it
            with metrics.reporting("commit"):
                metrics.committed(batch)
        _log_ranges(self.log, batch)
        emit_batch_events(context, self.outlets, [batch_event_extra(batch, coordinator.ledger.batch_interval(batch_id))])
        if coordinator.config.mirror_consumer_group:
            from airflow_exactly_once.kafka.consumer_group import mirror_committed_offsets

            self.log.info("notify_complete: %s",
                          mirror_committed_offsets(coordinator.config, coordinator.ledger).message)
        pruned = coordinator.retain()
        if pruned:
            self.log.info("notify_complete: retention: %s", pruned)
        metrics.phase_duration("notify_complete", time.monotonic() - started)
        return message


class AbortBatchOperator(_BatchStepOperator):
    """After a failure for good: discard staged output and release the range for the next run."""

    ui_color = "#ffd6d6"

    def run_step(self, context) -> str:
        coordinator = self.coordinator()
        batch_id = self.resolved_batch_id()
        if batch_id is None:  # plan died after recording the batch, before returning it
            batch = coordinator.ledger.latest_batch_for_run(coordinator.pipeline_id, context["run_id"])
            if batch is None:
                raise AirflowSkipException("this run planned no batch; nothing to abort")
            batch_id = batch.id
        self.record_lineage(batch_id)
        before = coordinator.ledger.get_batch(batch_id).state
        message = coordinator.abort(batch_id, f"run {context['run_id']} failed before committing")
        self.log.info("abort: %s", message)
        metrics = self.metrics
        with metrics.reporting("abort"):
            if before is BatchState.PLANNED and coordinator.ledger.get_batch(batch_id).state is BatchState.ABORTED:
                metrics.abort("failed_run")
        self.report_in_flight(coordinator)
        return message
