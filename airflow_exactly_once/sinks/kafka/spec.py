"""The Kafka sink's settings, declared once (docs table, unknown keys, secrets, dead-letter defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from airflow_exactly_once.core.declaration import SinkSpec, argument
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.kafka.setting_names import secret_keys
from airflow_exactly_once.records.bad_records import DEAD_LETTER_SUFFIX

DEFAULT_TRANSACTION_TIMEOUT_MS = 600_000


@dataclass(kw_only=True)
class KafkaSpec(SinkSpec):
    type_name = "kafka"
    writer_class = "airflow_exactly_once.sinks.kafka.sink_writer:KafkaSinkWriter"
    committer_class = "airflow_exactly_once.sinks.kafka.sink_committer:KafkaSinkCommitter"
    commands = "airflow_exactly_once.sinks.kafka.commands:add_commands"
    guarantees = ("NONE", "AT_LEAST_ONCE", "EXACTLY_ONCE")

    topic: str = argument(doc="Output topic (must exist)")
    guarantee: str | None = argument(None, "`EXACTLY_ONCE`, `AT_LEAST_ONCE` or `NONE` (below); the task group's old "
                                           "`guarantee=` argument still works and is moved here",
                                     shown_default="`EXACTLY_ONCE`")
    bootstrap_servers: str | None = argument(None, "Output cluster", shown_default="the pipeline's")
    transaction_timeout_ms: int = argument(DEFAULT_TRANSACTION_TIMEOUT_MS, "How long the broker keeps a "
                                                                           "pre-committed transaction open (see below)")
    transactional_id_prefix: str | None = argument(None, "Prefix of the transactional ids, unique per pipeline on "
                                                         "the cluster", shown_default="`pipeline_id`")
    transactional_ids: str = argument("pooled", "`pooled`: a fixed set of ids `<prefix>-<slot>-<partition>`, reused "
                                                "across batches (live ids stay at slots x partitions); `per_batch`: "
                                                "the first releases' `<prefix>-<batch_seq>-<partition>`, a new set "
                                                "per batch (see below)",
                                      choices=("pooled", "per_batch"))
    transactional_id_slots: int = argument(4, "Slots of the pooled ids: batch n uses slot n mod slots, and waits "
                                              "while an earlier batch of its slot is still open; keep it above the "
                                              "number of batches open at once (interval mode: `max_active_runs`); "
                                              "change it only while no batch is open (else `plan` refuses it)")
    kafka_config: dict[str, Any] | None = argument(None, "Client settings of the output cluster (security, "
                                                         "timeouts), in the `kafka` connection's spelling "
                                                         "([connections.md](../connections.md)); its passwords and "
                                                         "keys are secrets", shown_default="the pipeline's Kafka "
                                                                                           "settings")
    producer_config: dict[str, Any] | None = argument(None, "Producer settings in librdkafka's names, e.g. "
                                                            "`linger.ms`, `batch.size`, `compression.type`. Under "
                                                            "`EXACTLY_ONCE` the sink sets "
                                                            "`enable.sparse.connections=false` unless given here "
                                                            "(librdkafka then finds the transaction coordinator at "
                                                            "once instead of often 0.5 s later)",
                                                      shown_default="`{}`")

    value_format: str | None = argument(None, "Write the value in the Schema Registry wire format: `avro`, "
                                              "`json_schema` or `protobuf` (the pipeline's `schema_registry_conn_id` "
                                              "names the registry); the value is the `value` column if it is a "
                                              "struct, else every column but `key` and `headers`",
                                        choices=(None, "avro", "json_schema", "protobuf"),
                                        shown_default="`value` as bytes")
    key_format: str | None = argument(None, "Write the `key` column in the wire format: `avro`, `json_schema` or "
                                            "`protobuf`",
                                      choices=(None, "avro", "json_schema", "protobuf"), shown_default="`key` as bytes")
    value_schema: Any = argument(None, "The value's writer schema (Avro or JSON Schema as JSON, Protobuf as .proto "
                                       "text)",
                                 shown_default="derived from the output's columns")
    key_schema: Any = argument(None, "The key's writer schema", shown_default="derived from the `key` column")
    subject_name_strategy: str = argument("topic", "`topic` (subject `<topic>-value`, TopicNameStrategy) or "
                                                   "`record` (the record's or message's full name, "
                                                   "RecordNameStrategy)",
                                          choices=("topic", "record"))
    record_name: str | None = argument(None, "Name (`namespace.Name`) of a derived Avro record or Protobuf "
                                             "message (`package.Message`); with a given .proto, the message written "
                                             "(default its first)",
                                       shown_default="`<topic>_value` / `<topic>_key`")
    register_schemas: bool = argument(False, "Register a schema the subject lacks (the registry checks its "
                                             "compatibility); off: a schema must be registered beforehand")

    @classmethod
    def secret_paths(cls, spec: Mapping[str, Any]) -> list[list[str]]:
        """The secrets among the sink's own client settings (`kafka_config`), and any URL with a password."""
        settings = spec.get("kafka_config")
        own = [["kafka_config", key] for key in secret_keys(settings if isinstance(settings, dict) else None)]
        return own + [p for p in super().secret_paths(spec) if p not in own]

    @classmethod
    def dead_letter_beside(cls, spec: Mapping[str, Any]) -> dict[str, Any]:
        raise ConfigurationError("bad_record_policy='dead_letter' with the kafka sink needs a dead-letter topic: "
                                 "dead_letter={'type': 'kafka', 'topic': '<topic>'} (create it first)")

    @classmethod
    def as_dead_letter(cls, given: dict[str, Any], pipeline_id: str, output: Mapping[str, Any]) -> dict[str, Any]:
        """Its own transactions (a prefix no pipeline id has), and the output's guarantee when that is Kafka."""
        given.setdefault("transactional_id_prefix", pipeline_id + DEAD_LETTER_SUFFIX)
        given.setdefault("guarantee", output.get("guarantee", "EXACTLY_ONCE") if output.get("type") == "kafka"
                         else "EXACTLY_ONCE")
        return given
