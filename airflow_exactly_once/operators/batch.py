"""The four steps of one exactly-once micro-batch as Airflow operators.

All of them take the same pipeline arguments (operators.arguments: one declaration, shared
by the task group); `__init__` only stores them and every operator does its I/O in
`execute`. XCom carries nothing but the batch id, "<pipeline_id>:<batch_seq>".

Airflow imports this module with the DAG in every task, so what only one step needs is imported in that
step: kafka-python in plan (and in notify_complete for a mirrored consumer group), a Spark client in write
(operators.write_launch), OpenLineage's facets where that provider asks for them.
"""

from __future__ import annotations

import json
import time
import warnings
from datetime import datetime, timezone
from functools import cached_property
from typing import Any, Callable, Iterable, Sequence

from airflow_exactly_once.airflow_integration.assets import batch_event_extra, emit_batch_events
from airflow_exactly_once.airflow_integration.compat import (
    AirflowFailException,
    AirflowSkipException,
    BaseOperator,
    mask_secret,
)
from airflow_exactly_once.airflow_integration.metrics import PipelineMetrics
from airflow_exactly_once.airflow_integration.placement import LocalFolderWarning, local_folder_problems
from airflow_exactly_once.observe.backlog import IN_FLIGHT, InFlightSummary
from airflow_exactly_once.core.config import PipelineConfig, transform_name
from airflow_exactly_once.core.errors import DataLossError, ExactlyOnceError, TransactionLostError
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.planning import PlanOutcome, plan_batch
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.secrets import scrub, scrub_value, url_password
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.timestamps import to_epoch_ms
from airflow_exactly_once.hooks.kafka import source_kafka_settings
from airflow_exactly_once.hooks.ledger import LedgerHook
from airflow_exactly_once.hooks.schema_registry import SchemaRegistryHook
from airflow_exactly_once.hooks.spark_connect import spark_connect_url
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.operators import arguments
from airflow_exactly_once.operators.txn_guardrail import check_commit_deadline
from airflow_exactly_once.operators.write_launch import (
    attempts_stopper,
    check_packages_at_parse,
    check_write_packages,
    write_launcher,
)
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import check_sink_spec_at_parse, pipeline_committer, spec_local_folders
from airflow_exactly_once.sinks.dead_letters import lineage_outputs
from airflow_exactly_once.spark.launch.launcher import WriteLauncher
from airflow_exactly_once.spark.write_report import WriteReport

__all__ = [
    "ExactlyOnceBaseOperator",
    "PlanBatchOperator",
    "WriteBatchOperator",
    "NotifyCompleteOperator",
    "AbortBatchOperator",
]


class ExactlyOnceBaseOperator(BaseOperator):
    """Holds the pipeline arguments and turns protocol errors into the right Airflow outcome.

{params}
    """

    template_fields: Sequence[str] = arguments.TEMPLATE_FIELDS
    template_fields_renderers = {"sink": "json", "kafka_config": "json"}
    ui_color = "#e8f4ea"

    # [START generated: operators.arguments.init_source signature]
    def __init__(
        self,
        *,
        pipeline_id: str,
        topics: str | list[str] | None = None,
        topic_pattern: str | None = None,
        sink: dict[str, Any],
        bootstrap_servers: str = "",
        startup_mode: str = "earliest",
        new_partition_start: str = "earliest",
        max_records_per_partition: int | None = None,
        local_read_max_records: int = 50000,
        data_loss_policy: str = "fail",
        transform: str | Callable[..., Any] | None = None,
        kafka_config: dict[str, Any] | None = None,
        guarantee: str | None = None,
        mirror_consumer_group: str | None = None,
        startup_timestamp: int | str | None = None,
        startup_offsets: dict[str, Any] | None = None,
        startup_group_id: str | None = None,
        startup_fallback: str = "earliest",
        range_mode: str = "continuation",
        interval_rerun: str = "noop",
        value_format: str | None = None,
        value_schema: Any = None,
        key_format: str | None = None,
        key_schema: Any = None,
        value_subject: str | None = None,
        key_subject: str | None = None,
        bad_record_policy: str = "fail",
        dead_letter: dict[str, Any] | None = None,
        max_bad_records: int | float | None = None,
        retention_batches: int | None = 1000,
        retention_days: int | float | None = 7,
        kafka_conn_id: str = "kafka_default",
        ledger_conn_id: str | None = None,
        ledger_url: str | None = None,
        spark_conf: dict[str, Any] | None = None,
        schema_registry_conn_id: str | None = None,
        spark_conn_id: str | None = None,
        spark_connect_session: str = "pipeline",
        **kwargs: Any,
    ) -> None:
    # [END generated: operators.arguments.init_source signature]
        arguments.check_task_choices({"spark_connect_session": spark_connect_session})
        # When the DAG is parsed: a sink type that does not exist, a mistyped key or a value its declaration does not
        # allow fails the DAG's import (templated values are checked when the task renders them).
        check_sink_spec_at_parse(sink)
        check_sink_spec_at_parse(dead_letter, "dead_letter")
        # And a JVM library the sink needs that has no build for the installed pyspark's line (Iceberg's runtime).
        check_packages_at_parse(sink, dead_letter, bad_record_policy, spark_conn_id, spark_conf)
        super().__init__(**kwargs)
        # The pipeline arguments, one attribute each, in the order operators.arguments declares them. A templated one
        # holds the Jinja text until the task renders it.
        # [START generated: operators.arguments.init_source attributes]
        self.pipeline_id: str = pipeline_id
        self.topics: str | list[str] = [] if topics is None else topics
        self.topic_pattern: str | None = topic_pattern
        self.sink: dict[str, Any] = sink
        self.bootstrap_servers: str = bootstrap_servers
        self.startup_mode: str = startup_mode
        self.new_partition_start: str = new_partition_start
        self.max_records_per_partition: int | None = max_records_per_partition
        self.local_read_max_records: int = local_read_max_records
        self.data_loss_policy: str = data_loss_policy
        self.transform: str | Callable[..., Any] | None = transform
        self.kafka_config: dict[str, Any] = {} if kafka_config is None else kafka_config
        self.guarantee: str | None = guarantee
        self.mirror_consumer_group: str | None = mirror_consumer_group
        self.startup_timestamp: int | str | None = startup_timestamp
        self.startup_offsets: dict[str, Any] | None = startup_offsets
        self.startup_group_id: str | None = startup_group_id
        self.startup_fallback: str = startup_fallback
        self.range_mode: str = range_mode
        self.interval_rerun: str = interval_rerun
        self.value_format: str | None = value_format
        self.value_schema: Any = value_schema
        self.key_format: str | None = key_format
        self.key_schema: Any = key_schema
        self.value_subject: str | None = value_subject
        self.key_subject: str | None = key_subject
        self.bad_record_policy: str = bad_record_policy
        self.dead_letter: dict[str, Any] | None = dead_letter
        self.max_bad_records: int | float | None = max_bad_records
        self.retention_batches: int | None = retention_batches
        self.retention_days: int | float | None = retention_days
        self.kafka_conn_id: str = kafka_conn_id
        self.ledger_conn_id: str | None = ledger_conn_id
        self.ledger_url: str | None = ledger_url
        self.spark_conf: dict[str, Any] | None = spark_conf
        self.schema_registry_conn_id: str | None = schema_registry_conn_id
        self.spark_conn_id: str | None = spark_conn_id
        self.spark_connect_session: str = spark_connect_session
        # [END generated: operators.arguments.init_source attributes]
        _mask(self.argument_secrets())  # literal secrets: out of the logs from the start
        # When the DAG is parsed: the embedded ledger where this task may run on several machines is a warning here,
        # and an error when the task runs.
        self.ledger_hook().warn_placement(self.pipeline_id)
        for problem in self.local_folder_problems():
            warnings.warn(f"pipeline {self.pipeline_id}: {problem}", LocalFolderWarning, stacklevel=2)

    def render_template_fields(self, context, jinja_env=None) -> None:
        """Render, then register every secret of the rendered arguments with Airflow's secrets masker, before
        Airflow stores the rendered fields (it redacts what the masker knows) or anything logs them."""
        super().render_template_fields(context, jinja_env)
        _mask(self.argument_secrets())

    def argument_secrets(self) -> list[str]:
        """The secrets of this operator's arguments as they stand now (rendered, once the task runs)."""
        return arguments.secret_texts({a.name: getattr(self, a.name) for a in arguments.ARGUMENTS})

    # -- building blocks (called once the fields are rendered: from execute, and from the OpenLineage methods) ----

    # What the OpenLineage methods (called after execute) report: the batch this step worked on and the batches plan's
    # recovery committed. Each step records them itself, as soon as it knows them (record_lineage).
    _lineage_batch_id: BatchId | None = None
    _lineage_recovered: tuple[str, ...] = ()

    def record_lineage(self, batch_id: BatchId | None, recovered: Iterable[BatchId] = ()) -> None:
        """Keep what this step worked on for the OpenLineage methods."""
        self._lineage_batch_id = batch_id
        self._lineage_recovered = tuple(str(b) for b in recovered)

    def pipeline_config(self) -> PipelineConfig:
        """The pipeline's settings with its connections resolved (the step and the OpenLineage listener both ask)."""
        return self._pipeline_config

    @cached_property
    def _pipeline_config(self) -> PipelineConfig:
        """Built once per task attempt, from the rendered arguments: each connection is looked up once."""
        settings = source_kafka_settings(self.kafka_conn_id, self.kafka_config, self.bootstrap_servers)
        values = {a.name: getattr(self, a.name) for a in arguments.PIPELINE_ARGUMENTS}
        values.update(
            topics=[self.topics] if isinstance(self.topics, str) else list(self.topics or []),
            topic_pattern=_optional(self.topic_pattern),
            sink=dict(self.sink), transform=transform_name(self.transform),
            bootstrap_servers=settings.bootstrap_servers, kafka_config=dict(settings.properties),
            kafka_origin=settings.origin, kafka_conn_id=_optional(self.kafka_conn_id),
            max_records_per_partition=_optional_int(self.max_records_per_partition),
            mirror_consumer_group=_optional(self.mirror_consumer_group),
            startup_timestamp=_optional(self.startup_timestamp), startup_offsets=_optional(self.startup_offsets),
            startup_group_id=_optional(self.startup_group_id), guarantee=_optional(self.guarantee),
            schema_registry_conn_id=_optional(self.schema_registry_conn_id),
            schema_registry=SchemaRegistryHook(registry_conn_id).client_settings()
            if (registry_conn_id := _optional(self.schema_registry_conn_id)) else None,
        )
        config = checked(PipelineConfig(**values))
        _mask(config.secret_texts())  # with those the connections added
        return config

    def ledger_hook(self) -> LedgerHook:
        """The pipeline's ledger, as this task opens it (under the executor the task runs under)."""
        return LedgerHook(ledger_conn_id=self.ledger_conn_id, ledger_url=self.ledger_url, executor=self.executor)

    def local_folder_problems(self) -> list[str]:
        """The sink's folders that other workers may not see under the executor this task runs under (a warning:
        a folder every worker mounts is a valid setup)."""
        folders = spec_local_folders(self.sink) + spec_local_folders(self.dead_letter, "dead_letter")
        return local_folder_problems(folders, self.executor)

    def spark_connect_url(self) -> str | None:
        """The Spark Connect server the writes run on (None: in the task, or spark-submitted)."""
        return self._spark_connect_url

    @cached_property
    def _spark_connect_url(self) -> str | None:
        """Read once per task attempt: it looks up the spark connection."""
        url = spark_connect_url(self.spark_conn_id, self.spark_conf)
        _mask([url_password(url)])  # a token from the spark_connect connection
        return url

    def coordinator(self) -> BatchCoordinator:
        config = self.pipeline_config()
        return BatchCoordinator(config, self.ledger_hook().get_conn(), pipeline_committer(config),
                                stop_attempts=attempts_stopper(self.spark_connect_url()))

    @cached_property
    def metrics(self) -> PipelineMetrics:
        """This pipeline's metrics (airflow_integration/metrics.py), for the rendered pipeline_id; one per step."""
        return PipelineMetrics(str(self.pipeline_id), logger=self.log)

    def report_in_flight(self, coordinator: BatchCoordinator) -> None:
        """The batches in flight and the oldest PREPARED one against the sink's commit deadline, from the ledger."""
        metrics = self.metrics
        with metrics.reporting("batches in flight"):
            flying = coordinator.ledger.list_batches(coordinator.pipeline_id, IN_FLIGHT, newest_first=False)
            metrics.in_flight(InFlightSummary.read(flying, datetime.now(timezone.utc),
                                                   coordinator.sink.commit_deadline_ms()))

    def execute(self, context) -> Any:
        """The step; its XCom (a batch id, a message, a write's counts) and a failure's message hold no secret."""
        secrets = self.argument_secrets()
        try:
            self.ledger_hook().check_placement()  # before any server is asked, and before the ledger is opened
            for problem in self.local_folder_problems():  # rendered now: templated paths too
                self.log.warning("%s", problem)
            return scrub_value(self.run_step(context), secrets)
        except ExactlyOnceError as exc:
            self.log.error("%s: %s", type(exc).__name__, exc)
            if isinstance(exc, DataLossError):
                self.metrics.data_loss("fail")
            if exc.retriable:
                raise
            # Retrying cannot help (bad configuration, data loss, fenced, a transform bug).
            raise AirflowFailException(scrub(f"{type(exc).__name__}: {exc}", secrets)) from exc

    def run_step(self, context) -> Any:
        raise NotImplementedError

    # -- OpenLineage: the provider's DefaultExtractor calls these, only where it is installed and on ------

    def get_openlineage_facets_on_start(self) -> Any:
        return self._lineage(None, [])

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return self._step_lineage()

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        return self._step_lineage()

    def _step_lineage(self) -> Any:
        """Lineage with the batch this step worked on, in the state the ledger holds it now."""
        batch_id = self._lineage_batch_id
        batch = None if batch_id is None else self.ledger_hook().get_conn().get_batch(batch_id)
        return self._lineage(batch, list(self._lineage_recovered))

    def _lineage(self, batch: Batch | None, recovered: list[str]) -> Any:
        """The step's OpenLineage: the pipeline's topics, what its sinks write (named by them), `batch`."""
        from airflow_exactly_once.airflow_integration.lineage import step_lineage

        config = self.pipeline_config()
        return step_lineage(config, lineage_outputs(pipeline_committer(config).bind(config)), batch, recovered)


ExactlyOnceBaseOperator.__doc__ = (ExactlyOnceBaseOperator.__doc__ or "").format(params=arguments.param_docs())


def _mask(secrets: Iterable[str | None]) -> None:
    """Tell Airflow's secrets masker: task logs, rendered fields and XComs then show *** instead."""
    for secret in secrets:
        if secret:
            mask_secret(secret)


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
