"""The Kafka sink's writer: Flink's two-phase commit on Kafka transactions, the staging half.

Spec: {"type": "kafka", "topic": "out"} plus optional "guarantee" (NONE, AT_LEAST_ONCE,
EXACTLY_ONCE: the default), "bootstrap_servers" (default: the pipeline's),
"transaction_timeout_ms", "transactional_id_prefix" (default: the pipeline id),
"kafka_config" (client settings of the output cluster, default: the pipeline's) and
"producer_config" (producer-only settings in librdkafka's names, such as linger.ms or compression.type).

The transformed DataFrame must have a `value` column (STRING or BINARY) and may have a
`key` column and a `headers` column; other columns are ignored. Under the sink's guarantee:

- EXACTLY_ONCE: every Spark partition writes into its own transaction and pre-commits it
  (sinks.kafka.writer); the committer (sinks.kafka.sink_committer) commits them all at once.
- AT_LEAST_ONCE: records are flushed and acknowledged before the batch becomes PREPARED.
- NONE: records are sent with acks=0 and nobody waits for them.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError, TransformError
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import RunWriters
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.core.sink_writer import SinkWriter
from airflow_exactly_once.records.bad_records import DEAD_LETTER_COLUMNS
from airflow_exactly_once.sinks.kafka.committable import KafkaCommittable
from airflow_exactly_once.sinks.kafka.output import KafkaOutput
from airflow_exactly_once.sinks.kafka.spec import KafkaSpec
from airflow_exactly_once.sinks.kafka.wire_format import encoded
from airflow_exactly_once.sinks.kafka.writer import KafkaPartitionWriter

log = logging.getLogger(__name__)

HEADERS_TYPE = "array<struct<key:string,value:binary>>"
DEAD_LETTER_HEADER_PREFIX = "aeo."


class KafkaSinkWriter(SinkWriter):
    spec_type = KafkaSpec
    joins_reads = True  # a producer and a transaction per Spark partition: many ranges are read a core's share each

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.output = KafkaOutput(spec, self.guarantee)

    def bind(self, config: PipelineConfig, committer: SinkCommitter) -> "KafkaSinkWriter":
        super().bind(config, committer)
        self.output.pipeline = config
        return self

    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> KafkaCommittable:
        output = self.output
        settings = output.client_settings()
        naming = output.naming
        if self.guarantee == "EXACTLY_ONCE":  # pooled ids: no earlier batch of the slot may still hold them
            naming.ensure_free(batch, self.committer.ledger if self.committer is not None else None)
        writer = KafkaPartitionWriter(
            topic=output.topic, guarantee=self.guarantee, transactional_id_prefix=output.id_prefix,
            batch_seq=batch.seq, transaction_timeout_ms=output.transaction_timeout_ms, settings=settings,
            producer_config=output.producer_config, naming=naming)
        if output.wire_writers:
            frame = encoded(frame, output.wire_writers, self.pipeline)
        # [START failed_stage]
        try:
            reports = run_writers(self._key_value(frame), writer)
        except Exception as exc:
            if self.guarantee == "EXACTLY_ONCE" and self.committer is not None:
                log.warning("the write failed; aborting the transactions its partitions left open")
                try:
                    self.committer.abort(batch, None)
                except ExactlyOnceError as failed:  # the write's own error matters more; abort/recovery retry this
                    log.warning("%s", failed)
        # [END failed_stage]
            explained = output.explained(settings, exc)
            if explained is None:
                raise
            raise explained from exc
        pooled = self.guarantee == "EXACTLY_ONCE" and naming.pooled
        return KafkaCommittable(self.guarantee, settings.bootstrap_servers, output.topic,
                                tuple(sorted(reports, key=lambda r: r.partition)),
                                naming.slot(batch.seq) if pooled else None, naming.slots if pooled else None)

    @staticmethod
    def _key_value(frame: Any) -> Any:
        """The `key`, `value` (and `headers`) columns as Kafka writes them, or a TransformError that says why not."""
        types = {f.name: f.dataType.simpleString() for f in frame.schema.fields}
        for name in ("value", "key"):
            if name in types and types[name] not in ("string", "binary"):
                raise TransformError(
                    f"the kafka sink writes the {name!r} column as bytes, but the transform returned it as "
                    f"{types[name]}; return STRING or BINARY (e.g. to_json(struct(...)) AS {name})")
        if "value" not in types:
            raise TransformError(
                f"the kafka sink needs a 'value' column (STRING or BINARY) and optionally 'key'; the transform "
                f"returned columns {', '.join(types) or 'none'}")
        if "headers" in types and types["headers"] != HEADERS_TYPE:
            raise TransformError(f"the kafka sink writes a 'headers' column of type {HEADERS_TYPE} (as Spark's Kafka "
                                 f"writer does); the transform returned {types['headers']}")
        columns = ["CAST(key AS BINARY) AS key"] if "key" in types else []
        columns += ["CAST(value AS BINARY) AS value"] + (["headers"] if "headers" in types else [])
        return frame.selectExpr(*columns)

    def shape_dead_letters(self, frame: Any) -> Any:
        """As Kafka Connect's dead-letter queue: the original key and value, where it came from and why in headers.

        With value_format on the dead-letter spec, the value is instead one record of every dead-letter column
        (the original value as bytes among them) in the wire format; the key stays the original bytes."""
        if self.output.wire_writers:
            if any(w.part == "key" for w in self.output.wire_writers):
                raise ConfigurationError("a kafka dead-letter destination keeps each bad record's original key bytes: "
                                         "remove key_format from dead_letter (value_format is allowed)")
            return frame.select(*DEAD_LETTER_COLUMNS)
        headers = ", ".join(f"named_struct('key', '{DEAD_LETTER_HEADER_PREFIX}{name}', 'value', "
                            f"CAST(CAST({name} AS STRING) AS BINARY))"
                            for name in DEAD_LETTER_COLUMNS if name not in ("key", "value"))
        return frame.selectExpr("key", "value", f"array({headers}) AS headers")
