"""The four steps of one exactly-once micro-batch as Airflow operators.

All of them take the same pipeline arguments (the task group passes them through);
`__init__` only stores them and every operator does its I/O in `execute`.
XCom carries nothing but the batch id, "<pipeline_id>:<batch_seq>".
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

from airflow_exactly_once.assets import batch_event_extra, emit_batch_events
from airflow_exactly_once.compat import AirflowFailException, AirflowSkipException, BaseOperator
from airflow_exactly_once.core.config import PipelineConfig, transform_name
from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.timestamps import to_epoch_ms
from airflow_exactly_once.hooks.kafka import kafka_bootstrap_servers
from airflow_exactly_once.hooks.ledger import LedgerHook
from airflow_exactly_once.sinks import create_sink


class ExactlyOnceBaseOperator(BaseOperator):
    """Holds the pipeline arguments and turns protocol errors into the right Airflow outcome."""

    template_fields: Sequence[str] = (
        "pipeline_id", "topics", "sink", "bootstrap_servers", "ledger_url", "startup_mode",
        "max_records_per_partition", "data_loss_policy", "guarantee", "mirror_consumer_group",
        "new_partition_start", "startup_timestamp", "startup_offsets", "startup_group_id", "startup_fallback",
        "range_mode", "interval_rerun",
    )  # not `transform`: Airflow calls callables found in template fields
    template_fields_renderers = {"sink": "json"}
    ui_color = "#e8f4ea"

    def __init__(
        self,
        *,
        pipeline_id: str,
        topics: str | list[str],
        sink: dict[str, Any],
        kafka_conn_id: str = "kafka_default",
        bootstrap_servers: str | None = None,
        ledger_conn_id: str | None = None,
        ledger_url: str | None = None,
        startup_mode: str = "earliest",
        new_partition_start: str = "earliest",
        max_records_per_partition: int | None = None,
        data_loss_policy: str = "fail",
        transform: str | Callable | None = None,
        kafka_config: dict[str, Any] | None = None,
        spark_conf: dict[str, Any] | None = None,
        spark_conn_id: str | None = None,
        guarantee: str = "EXACTLY_ONCE",
        mirror_consumer_group: str | None = None,
        startup_timestamp: Any = None,
        startup_offsets: dict[str, Any] | None = None,
        startup_group_id: str | None = None,
        startup_fallback: str = "earliest",
        range_mode: str = "continuation",
        interval_rerun: str = "noop",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline_id = pipeline_id
        self.topics = topics
        self.sink = sink
        self.kafka_conn_id = kafka_conn_id
        self.bootstrap_servers = bootstrap_servers
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.startup_mode = startup_mode
        self.new_partition_start = new_partition_start
        self.max_records_per_partition = max_records_per_partition
        self.data_loss_policy = data_loss_policy
        self.transform = transform
        self.kafka_config = kafka_config
        self.spark_conf = spark_conf
        self.spark_conn_id = spark_conn_id
        self.guarantee = guarantee
        self.mirror_consumer_group = mirror_consumer_group
        self.startup_timestamp = startup_timestamp
        self.startup_offsets = startup_offsets
        self.startup_group_id = startup_group_id
        self.startup_fallback = startup_fallback
        self.range_mode = range_mode
        self.interval_rerun = interval_rerun

    # -- building blocks (called from execute only) --------------------------------

    def pipeline_config(self) -> PipelineConfig:
        servers = self.bootstrap_servers
        if not servers:
            try:
                servers = kafka_bootstrap_servers(self.kafka_conn_id)
            except ConfigurationError:
                raise
            except Exception as exc:
                raise ConfigurationError(
                    f"no bootstrap_servers given and the Kafka connection {self.kafka_conn_id!r} cannot be read "
                    f"({exc}); create it with extra {{\"bootstrap.servers\": \"host:port\"}} or pass "
                    "bootstrap_servers=") from exc
        topics = [self.topics] if isinstance(self.topics, str) else list(self.topics)
        return PipelineConfig(
            pipeline_id=self.pipeline_id, topics=topics, sink=dict(self.sink), bootstrap_servers=servers,
            startup_mode=self.startup_mode, new_partition_start=self.new_partition_start,
            max_records_per_partition=_optional_int(self.max_records_per_partition),
            data_loss_policy=self.data_loss_policy,
            transform=transform_name(self.transform), kafka_config=dict(self.kafka_config or {}),
            guarantee=self.guarantee,
            mirror_consumer_group=None if self.mirror_consumer_group in (None, "", "None") else self.mirror_consumer_group,
            startup_timestamp=_optional(self.startup_timestamp), startup_offsets=_optional(self.startup_offsets),
            startup_group_id=_optional(self.startup_group_id), startup_fallback=self.startup_fallback,
            range_mode=self.range_mode, interval_rerun=self.interval_rerun,
        ).validate()

    def coordinator(self) -> BatchCoordinator:
        from airflow_exactly_once.sources.kafka_offsets import KafkaOffsetSource

        config = self.pipeline_config()
        ledger = LedgerHook(ledger_conn_id=self.ledger_conn_id, ledger_url=self.ledger_url).get_conn()
        return BatchCoordinator(config, ledger, create_sink(config.sink),
                                lambda: KafkaOffsetSource(config.bootstrap_servers, config.kafka_config))

    def execute(self, context) -> Any:
        try:
            return self.run_step(context)
        except ExactlyOnceError as exc:
            self.log.error("%s: %s", type(exc).__name__, exc)
            if exc.retriable:
                raise
            # Retrying cannot help (bad configuration, data loss, fenced, a transform bug).
            raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc

    def run_step(self, context) -> Any:
        raise NotImplementedError


def _optional_int(value: Any) -> int | None:
    return None if value in (None, "", "None") else int(value)


def _optional(value: Any) -> Any:
    """None for the ways an unset templated value renders."""
    return None if isinstance(value, str) and value in ("", "None") else value


def _data_interval(context) -> tuple[int, int] | None:
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None:
        return None
    return to_epoch_ms(start), to_epoch_ms(end)


def _log_ranges(log, batch: Batch) -> None:
    for r in batch.ranges:
        log.info("  %s[%d] offsets %d..%d (%d offsets)", r.topic, r.partition, r.start, r.end, r.size)


class _BatchStepOperator(ExactlyOnceBaseOperator):
    """A step that works on the batch planned by the `plan` task of the same run."""

    template_fields: Sequence[str] = (*ExactlyOnceBaseOperator.template_fields, "batch_id")

    def __init__(self, *, batch_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch_id = batch_id

    def resolved_batch_id(self) -> BatchId | None:
        text = (self.batch_id or "").strip()
        return None if text in ("", "None") else BatchId.parse(text)


class PlanBatchOperator(ExactlyOnceBaseOperator):
    """Recover PREPARED batches, then fix this run's offset range (or reuse the one it fixed)."""

    ui_color = "#cfe8ff"

    def run_step(self, context) -> str | None:
        from airflow_exactly_once.operators.txn_guardrail import check_commit_deadline

        coordinator = self.coordinator()
        check_commit_deadline(self, coordinator.sink, self.log)
        interval = _data_interval(context) if coordinator.config.range_mode == "interval" else None
        outcome = coordinator.plan(run_id=context["run_id"], interval=interval)
        for batch_id in coordinator.recovered:
            recovered = coordinator.ledger.get_batch(batch_id)
            self.log.info("plan: recovery committed batch %s left PREPARED by run %s", batch_id, recovered.run_id)
            emit_batch_events(context, self.outlets, [batch_event_extra(
                recovered, coordinator.ledger.batch_interval(batch_id))])
        self.log.info("plan: %s", outcome.message)
        if outcome.batch is not None:
            _log_ranges(self.log, outcome.batch)
        if not outcome.needs_commit:  # nothing to write: write and notify_complete are skipped
            if coordinator.recovered:
                return None  # succeed, so that the recovered batches' Asset events are emitted
            raise AirflowSkipException(outcome.message)
        return str(outcome.batch.id)


class WriteBatchOperator(_BatchStepOperator):
    """Run the Spark job: read exactly the planned range, transform, write pre-committed output.

    In-process (`local[*]`, or `spark_conf["spark.master"]`) by default; with `spark_conn_id`
    (an Airflow `spark` connection) spark-submitted to that cluster instead.
    """

    ui_color = "#ffe6c7"
    submit_hook = None  # the running spark-submit, for on_kill

    def run_step(self, context) -> dict[str, Any]:
        from airflow_exactly_once.spark.job import run_write
        from airflow_exactly_once.spark.session import build_spark_session

        batch_id = self.resolved_batch_id()
        if batch_id is None:
            raise AirflowSkipException("no batch was planned in this run")
        if self.spark_conn_id:
            from airflow_exactly_once.operators.spark_submit import write_on_cluster

            summary = write_on_cluster(self, batch_id)
            self.log.info("write: %s", json.dumps(summary))
            return summary
        coordinator = self.coordinator()
        spark = build_spark_session(f"exactly-once {batch_id}", self.spark_conf)
        try:
            summary = run_write(spark, coordinator, batch_id, transform=self.transform)
        finally:
            spark.stop()
        self.log.info("write: %s", json.dumps(summary))
        return summary

    def on_kill(self) -> None:
        if self.submit_hook is not None:
            self.submit_hook.on_kill()


class NotifyCompleteOperator(_BatchStepOperator):
    """Commit the sink output, then advance the offsets (Flink's notifyCheckpointComplete)."""

    ui_color = "#d4f5d4"

    def run_step(self, context) -> str:
        batch_id = self.resolved_batch_id()
        if batch_id is None:
            raise AirflowSkipException("no batch was planned in this run")
        coordinator = self.coordinator()
        message = coordinator.commit(batch_id)
        self.log.info("notify_complete: %s", message)
        batch = coordinator.ledger.get_batch(batch_id)
        self.log.info("notify_complete: batch %s committed %s records read, %s written", batch_id,
                      batch.input_records, batch.output_records)
        _log_ranges(self.log, batch)
        emit_batch_events(context, self.outlets, [batch_event_extra(batch, coordinator.ledger.batch_interval(batch_id))])
        if coordinator.config.mirror_consumer_group:
            from airflow_exactly_once.sources.consumer_group import mirror_committed_offsets

            self.log.info("notify_complete: %s", mirror_committed_offsets(coordinator.config, coordinator.ledger))
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
        message = coordinator.abort(batch_id, f"run {context['run_id']} failed before committing")
        self.log.info("abort: %s", message)
        return message
