"""The Kafka sink writing Protobuf in the Schema Registry wire format, against the real registry (Apicurio, basic
auth), Kafka and Spark; read back by confluent-kafka's own ProtobufDeserializer.

The input is JSON; the value's schema is derived from the output's columns, the key's is given as
.proto text, and the dead letters go to a Kafka topic in Protobuf too (their schema derived from
the dead-letter columns).
"""

from __future__ import annotations

import datetime
import json
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.records import protobuf_rows
from airflow_exactly_once.records.registry import protobuf_reader
from airflow_exactly_once.spark.write_job import run_write
from tests.helpers import create_topic
from tests.integration.test_schema_registry_formats import pipe, produce, registry_settings

KEY_SCHEMA = 'syntax = "proto3";\npackage shop;\nmessage OrderKey { int64 id = 1; string region = 2; }\n'
TRANSFORM = ("named_struct('id', id, 'region', 'eu') AS key", "id", "item", "tags", "at")


def _read(kafka, client, topic: str, expected: int, with_key: bool = False) -> list:
    """The committed records of `topic`, each part decoded by ProtobufDeserializer with the message class of
    the subject's latest schema (as a consumer's generated class would be)."""
    def deserializer(part: str) -> ProtobufDeserializer:
        text = client.get_latest_version(f"{topic}-{part}").schema.schema_str
        message = protobuf_reader(text, {}, "test")
        return ProtobufDeserializer(protobuf_rows.message_class(message.descriptor_set, message.name),
                                    {"use.deprecated.format": False})

    values = deserializer("value")
    keys = deserializer("key") if with_key else None
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])  # no group rebalance to wait
    found = []
    try:
        for _ in range(60):
            record = consumer.poll(1.0 if len(found) < expected else 0.2)
            if record is None or record.error():
                if len(found) >= expected:
                    break
                continue
            value = values(record.value(), SerializationContext(topic, MessageField.VALUE))
            found.append((keys(record.key(), SerializationContext(topic, MessageField.KEY)), value) if keys
                         else value)
    finally:
        consumer.close()
    return found


def _written(kafka, topic: str, partitions: int) -> int:
    """Every record in the topic, committed or not (high watermarks)."""
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"w-{uuid.uuid4().hex[:6]}"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions))
    finally:
        consumer.close()


def test_kafka_to_kafka_in_protobuf_reads_back_with_confluent_kafkas_deserializer(kafka, spark, schema_registry,
                                                                                 tmp_path):
    topic = f"sr-pw-{uuid.uuid4().hex[:8]}"
    output, dead_letters = f"{topic}-out", f"{topic}-dlq"
    for name, partitions in ((topic, 1), (output, 2), (dead_letters, 1)):
        create_topic(kafka.bootstrap_servers, name, partitions=partitions)
    at = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone.utc)
    good = [{"id": i, "item": None if i == 3 else f"item-{i}", "tags": ["a", "b"][: i % 3],
             "at": (at + datetime.timedelta(days=i)).isoformat()} for i in range(6)]
    produce(kafka, topic, [json.dumps(row).encode() for row in good] + [b"not json"])
    client = SchemaRegistryClient(registry_settings(schema_registry))
    settings = dict(value_format="json", value_schema="id BIGINT, item STRING, tags ARRAY<STRING>, at TIMESTAMP")
    sink = {"type": "kafka", "topic": output, "value_format": "protobuf", "key_format": "protobuf",
            "key_schema": KEY_SCHEMA}

    # registering off: a given schema the subject lacks fails at plan time, a derived one before any record
    with pytest.raises(ConfigurationError) as caught:
        pipe(kafka, schema_registry, tmp_path, topic, sink, name="off-key", **settings)
    message = str(caught.value)
    assert f"subject '{output}-key' has no version with the key schema" in message, message
    assert "the registry says" in message and "register_schemas" in message
    value_only = {k: v for k, v in sink.items() if not k.startswith("key_")}
    p = pipe(kafka, schema_registry, tmp_path, topic, value_only, name="off", bad_record_policy="skip", **settings)
    with pytest.raises(ConfigurationError) as caught:
        run_write(spark, p.coordinator, p.plan("run-1").batch.id, transform=lambda df: df.selectExpr(*TRANSFORM))
    message = str(caught.value)
    assert f"subject '{output}-value' has no version with the value schema" in message, message
    assert "the registry says" in message and "message " in message
    assert _written(kafka, output, 2) == 0

    # registering on: the value's schema (derived) and the key's (given) are registered, the dead letters' too
    p = pipe(kafka, schema_registry, tmp_path, topic, {**sink, "register_schemas": True}, name="on",
             bad_record_policy="dead_letter", **settings,
             dead_letter={"type": "kafka", "topic": dead_letters, "value_format": "protobuf",
                          "register_schemas": True})
    batch_id = p.plan("run-1").batch.id
    summary = run_write(spark, p.coordinator, batch_id, transform=lambda df: df.selectExpr(*TRANSFORM))
    assert (summary["output_records"], summary["bad_records"]) == (6, 1)
    p.commit(batch_id)

    registered = client.get_latest_version(f"{output}-value").schema
    assert registered.schema_type == "PROTOBUF" and "optional string item = 2;" in registered.schema_str
    assert "repeated string tags = 3;" in registered.schema_str and "google.protobuf.Timestamp at = 4;" in \
        registered.schema_str
    records = _read(kafka, client, output, len(good), with_key=True)
    seen = sorted((key.id, key.region, value.id, value.item if value.HasField("item") else None, list(value.tags),
                   value.at.ToDatetime(tzinfo=datetime.timezone.utc)) for key, value in records)
    assert seen == [(row["id"], "eu", row["id"], row["item"], row["tags"], datetime.datetime.fromisoformat(row["at"]))
                    for row in good]
    [letter] = _read(kafka, client, dead_letters, 1)
    assert (letter.source_offset, letter.value, letter.batch_id) == (6, b"not json", str(batch_id))
    assert letter.error and letter.source_topic == topic
