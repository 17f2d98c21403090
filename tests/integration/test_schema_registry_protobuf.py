"""Protobuf in the Schema Registry wire format, read from a real topic by the write's Spark decoding.

The records are made as a Confluent producer makes them: each .proto compiled (grpc_tools.protoc),
messages serialized by the protobuf runtime's classes of that descriptor, then the magic byte, the
schema id and the message indexes in front. The schemas are handed to spark.records.decode as the
driver's registry step makes them (records.registry.PartSchemas); the registry itself is not needed
to decode, only to fetch them.
"""

from __future__ import annotations

import datetime
import uuid

from kafka import KafkaProducer

from airflow_exactly_once.records import protobuf_rows
from airflow_exactly_once.records.registry import PartSchemas, protobuf_reader
from airflow_exactly_once.records.wire_format import frame, message_indexes
from airflow_exactly_once.spark import records
from tests.harness import pipeline_config
from tests.helpers import create_topic

V1 = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Order {
  int64 id = 1;
  Line line = 2;
  google.protobuf.Timestamp at = 3;
  message Line { string sku = 1; int32 qty = 2; }
}
message Refund { int64 order_id = 1; }
"""
V2 = V1.replace("  message Line", "  optional string note = 4;\n  repeated string tags = 5;\n  message Line")
KEY = 'syntax = "proto3";\npackage shop;\nmessage OrderKey { string region = 1; int64 id = 2; }\n'
V1_ID, V2_ID, KEY_ID = 11, 12, 21


def _serialized(text: str, name: str, **fields) -> bytes:
    message = protobuf_reader(text, {}, "test")
    cls = protobuf_rows.message_class(message.descriptor_set, name)
    return cls(**fields).SerializeToString()


def test_protobuf_values_and_keys_of_two_versions_decode_and_bad_ones_say_why(kafka, spark):
    at = datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.timezone.utc)
    seconds = int(at.timestamp())
    order_v1 = _serialized(V1, "shop.Order", id=1, line={"sku": "a", "qty": 2}, at={"seconds": seconds})
    order_v2 = _serialized(V2, "shop.Order", id=2, line={"sku": "b", "qty": 3}, note="gift", tags=["x", "y"])
    refund = _serialized(V1, "shop.Refund", order_id=1)
    values = [
        frame(V1_ID, message_indexes([0]) + order_v1),  # offset 0: v1, read with v2: no note, no tags
        frame(V2_ID, message_indexes([0]) + order_v2),  # 1
        frame(V1_ID, message_indexes([1]) + refund),  # 2: the file's second message, not the reader's
        frame(V2_ID, message_indexes([0]) + order_v2[:-2]),  # 3: truncated in a field (at a field boundary it is a valid message)
        b"plain text",  # 4: not framed
        frame(99, message_indexes([0]) + order_v1),  # 5: an id the registry does not know
        frame(V2_ID, message_indexes([0, 0]) + b"\x0a\x01z"),  # 6: a nested message's indexes (Order.Line)
    ]
    keys = [frame(KEY_ID, b"\x00" + _serialized(KEY, "shop.OrderKey", region="eu", id=i)) for i in range(len(values))]
    keys[1] = frame(KEY_ID, b"\x00\xff")  # a corrupt key: the record is bad for its key first

    topic = f"proto-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap_servers, topic, partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    for key, value in zip(keys, values):
        producer.send(topic, key=key, value=value, partition=0)
    producer.flush()
    producer.close()

    config = pipeline_config("proto", [topic], {"type": "parquet", "path": "/tmp/unused"},
                             bootstrap=kafka.bootstrap_servers, value_format="protobuf", key_format="protobuf",
                             schema_registry={"url": "http://127.0.0.1:9"})
    value_schemas = PartSchemas("value", "protobuf", V2, "subject 'orders-value' version 2 (id 12)",
                                writers={V1_ID: V1, V2_ID: V2})
    value_schemas.protobuf = protobuf_reader(V2, {}, value_schemas.reader_ref)
    key_schemas = PartSchemas("key", "protobuf", KEY, "subject 'orders-key' version 1 (id 21)", writers={KEY_ID: KEY})
    key_schemas.protobuf = protobuf_reader(KEY, {}, key_schemas.reader_ref)
    source = spark.read.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers) \
        .option("subscribe", topic).option("startingOffsets", "earliest").load()
    decoded = records.decode(records.with_source(source), config, {"value": value_schemas, "key": key_schemas})

    assert decoded.columns[:5] == ["id", "line", "at", "note", "tags"]  # the value's fields spread as columns
    rows = {r["offset"]: r for r in decoded.collect()}
    assert len(rows) == len(values)
    first = rows[0]
    assert (first["id"], first["line"]["sku"], first["line"]["qty"], first["note"], first["tags"]) == (1, "a", 2, None,
                                                                                                     [])
    assert first["at"].timestamp() == seconds and first["key"]["region"] == "eu" and first["key"]["id"] == 0
    assert first[records.DECODE_ERROR] is None
    errors = {offset: row[records.DECODE_ERROR] for offset, row in rows.items()}
    assert errors[1].startswith("key: truncated or corrupt Protobuf data of message shop.OrderKey")
    assert errors[2] == "Protobuf data of message indexes [1] (message shop.Refund), not the reader's message " \
                        "shop.Order [0]"
    assert errors[3].startswith("truncated or corrupt Protobuf data of message shop.Order")
    assert errors[4].startswith("not in the Schema Registry wire format")
    assert errors[5].startswith(records.UNKNOWN_ID + "99")
    assert "(message shop.Order.Line), not the reader's message" in errors[6]

    # v2's own record, with the key's error set aside: the v2 reader reads v2 data whole.
    keys[1] = frame(KEY_ID, b"\x00" + _serialized(KEY, "shop.OrderKey", region="us", id=1))
    again = spark.createDataFrame([(keys[1], values[1])], "key BINARY, value BINARY")
    [row] = records.decode(again, config, {"value": value_schemas, "key": key_schemas}).collect()
    assert (row["id"], row["note"], row["tags"], row["at"], row[records.DECODE_ERROR]) == (2, "gift", ["x", "y"],
                                                                                          None, None)
    assert row["key"].asDict() == {"region": "us", "id": 1}
