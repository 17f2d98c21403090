"""The output topic and its cluster's client settings, as a Kafka sink's writer and committer both need them.

Made from the sink's spec (checked here, once for both sides) and completed by the pipeline's
settings when the side that holds it is bound; it also says what a client's failure means for
the sink (a settings or ACL problem, else a SinkError).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kafka import KafkaProducer

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError, SinkError
from airflow_exactly_once.kafka.access import diagnose, explain_failure, explain_refusal, is_connection_failure
from airflow_exactly_once.kafka.setting_names import canonical_name
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks.kafka import librdkafka
from airflow_exactly_once.sinks.kafka.end_txn import END_TIMEOUT_MS
from airflow_exactly_once.sinks.kafka.spec import DEFAULT_TRANSACTION_TIMEOUT_MS
from airflow_exactly_once.sinks.kafka.transactional_ids import IdNaming, naming_of
from airflow_exactly_once.sinks.kafka.wire_format import part_writers


class KafkaOutput:
    """The topic a Kafka sink writes, its transactions' settings, and how its clients reach the cluster."""

    def __init__(self, spec: dict[str, Any], guarantee: str) -> None:
        if not isinstance(spec.get("topic"), str) or not spec["topic"]:
            raise ConfigurationError("the kafka sink needs an output 'topic', e.g. {'type': 'kafka', 'topic': 'out'}")
        self.spec = spec
        self.guarantee = guarantee
        self.topic: str = spec["topic"]
        try:
            self.transaction_timeout_ms = int(spec.get("transaction_timeout_ms") or DEFAULT_TRANSACTION_TIMEOUT_MS)
        except (TypeError, ValueError):
            raise ConfigurationError(f"kafka sink: transaction_timeout_ms={spec['transaction_timeout_ms']!r} is "
                                     "not a number of milliseconds") from None
        if self.transaction_timeout_ms <= 0:
            raise ConfigurationError("kafka sink: transaction_timeout_ms must be a positive number of milliseconds")
        self.wire_writers = part_writers(spec)  # value_format / key_format: the Schema Registry wire format
        # librdkafka properties; kafka-python's spelling of the same names (linger_ms) is accepted.
        self.producer_config = {canonical_name(k): v for k, v in (spec.get("producer_config") or {}).items()}
        bad = set(self.producer_config) & set(librdkafka.RESERVED)
        if bad:
            raise ConfigurationError(f"kafka sink: producer_config must not set {', '.join(sorted(bad))}; the sink "
                                     "sets them from its guarantee and the pipeline; remove them")
        try:
            librdkafka.check_producer_config(self.producer_config)
        except ValueError as exc:
            raise ConfigurationError(f"kafka sink: producer_config has settings librdkafka (the producer) does not "
                                     f"accept: {exc}") from None
        naming_of(spec, "")  # a bad naming or slot count is refused here, when the sink is made
        self.pipeline: PipelineConfig | None = None

    def client_settings(self, bootstrap_servers: str | None = None) -> KafkaSettings:
        """The output cluster: the sink's own servers and client settings, else the pipeline's."""
        if "kafka_config" in self.spec:
            settings = KafkaSettings.from_mapping(self.spec["kafka_config"], origin="the kafka sink's kafka_config")
        elif self.pipeline is not None:
            settings = KafkaSettings.of(self.pipeline)
        else:
            settings = KafkaSettings("")
        servers = bootstrap_servers or self.spec.get("bootstrap_servers")
        if servers:
            settings = dataclasses.replace(settings, bootstrap_servers=str(servers),
                                           origin="the kafka sink's bootstrap_servers")
        if not settings.bootstrap_servers:
            raise ConfigurationError("kafka sink: no bootstrap servers; give the sink 'bootstrap_servers' or the "
                                     "pipeline a kafka connection")
        return settings.check()

    @property
    def id_prefix(self) -> str:
        return self.spec.get("transactional_id_prefix") or (self.pipeline.pipeline_id if self.pipeline else "")

    @property
    def naming(self) -> IdNaming:
        """How this output's transactional ids are named (sinks.kafka.transactional_ids)."""
        return naming_of(self.spec, self.id_prefix)

    def failure(self, settings: KafkaSettings, exc: BaseException | str, doing: str,
                retriable: bool = True) -> ExactlyOnceError:
        """What a client's failure means for this sink: a settings or ACL problem (ConfigurationError), else a
        SinkError (retriable as given)."""
        return explain_failure(settings, exc, doing, lambda message: SinkError(message, retriable=retriable),
                               topics=(self.topic,), topic_operations="WRITE and DESCRIBE",
                               transactional_id_prefix=self.id_prefix)

    def explained(self, settings: KafkaSettings, exc: BaseException) -> ConfigurationError | None:
        """The settings or ACL problem behind a writer's failure, if that is what it was."""
        explained = explain_refusal(settings, exc, topics=(self.topic,), topic_operations="WRITE and DESCRIBE",
                                    transactional_id_prefix=self.id_prefix)
        if explained is None and is_connection_failure(exc):
            explained = diagnose(settings).error
        return explained

    def end_timeout_ms(self, settings: KafkaSettings) -> int:
        """How long EndTxn is retried when Kafka does not answer: the producer's max.block.ms, as before."""
        producer = {k: v for k, v in settings.kafka_python(KafkaProducer).items() if k != "bootstrap_servers"}
        return int(producer.get("max_block_ms", END_TIMEOUT_MS))
