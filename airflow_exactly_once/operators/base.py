"""What the four step operators have in common: the pipeline arguments and the building blocks made from them.

`ExactlyOnceBaseOperator` takes the pipeline arguments (operators.arguments: one declaration, shared by the task
group) and only stores them in `__init__`; once its fields are rendered it builds what a step works with (the
pipeline's config, its ledger hook, the coordinator, metrics, lineage), and `execute` turns protocol errors into the
right Airflow outcome. The steps themselves are in operators.batch, the public module that also exports this class;
kept apart so that what every step shares and what each step does are read on their own.

Airflow imports this module with the DAG in every task, so OpenLineage's facets are imported where that provider
asks for them.
"""

from __future__ import annotations

import warnings
from datetime import datetime, timezone
from functools import cached_property
from typing import Any, Callable, Iterable, Sequence

from airflow_exactly_once.airflow_integration.compat import AirflowFailException, BaseOperator, mask_secret
from airflow_exactly_once.airflow_integration.metrics import PipelineMetrics
from airflow_exactly_once.airflow_integration.placement import LocalFolderWarning, local_folder_problems
from airflow_exactly_once.observe.backlog import IN_FLIGHT, InFlightSummary
from airflow_exactly_once.core.config import PipelineConfig, transform_name
from airflow_exactly_once.core.errors import DataLossError, ExactlyOnceError
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.secrets import scrub, scrub_value, url_password
from airflow_exactly_once.hooks.kafka import source_kafka_settings
from airflow_exactly_once.hooks.ledger import LedgerHook
from airflow_exactly_once.hooks.schema_registry import SchemaRegistryHook
from airflow_exactly_once.hooks.spark_connect import spark_connect_url
from airflow_exactly_once.operators import arguments
from airflow_exactly_once.operators.write_launch import attempts_stopper, check_packages_at_parse
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import check_sink_spec_at_parse, pipeline_committer, spec_local_folders
from airflow_exactly_once.sinks.dead_letters import lineage_outputs

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
