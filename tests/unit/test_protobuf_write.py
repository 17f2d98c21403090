"""The pure parts of writing Protobuf in the Schema Registry wire format: the .proto derived from a Spark type, the
types it refuses, the check of columns against a given message, and the row encoder the executors run."""

from __future__ import annotations

import datetime
import json

import pytest

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.records import protobuf_encode, protobuf_rows
from airflow_exactly_once.records.registry import protobuf_reader
from airflow_exactly_once.records.schema_from_spark import proto_schema
from airflow_exactly_once.sinks.kafka.wire_format import part_writers


def field(name: str, kind, nullable: bool = True) -> dict:
    return {"name": name, "type": kind, "nullable": nullable, "metadata": {}}


def struct(*fields) -> dict:
    return {"type": "struct", "fields": list(fields)}


ORDER = struct(
    field("id", "long", nullable=False), field("note", "string"), field("qty", "short"),
    field("line", struct(field("sku", "string"), field("price", "double", nullable=False))),
    field("lines", {"type": "array", "elementType": struct(field("sku", "string")), "containsNull": True}),
    field("tags", {"type": "array", "elementType": "string", "containsNull": True}),
    field("attrs", {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True}),
    field("at", "timestamp"), field("raw", "binary"))


def test_a_spark_struct_becomes_a_proto3_message_with_one_field_per_column_in_order():
    assert proto_schema(ORDER, "Order", "shop") == """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

message Order {
  int64 id = 1;
  optional string note = 2;
  optional int32 qty = 3;
  Line line = 4;
  repeated Lines lines = 5;
  repeated string tags = 6;
  map<string, int64> attrs = 7;
  google.protobuf.Timestamp at = 8;
  optional bytes raw = 9;

  message Line {
    optional string sku = 1;
    double price = 2;
  }
  message Lines {
    optional string sku = 1;
  }
}
"""
    message = protobuf_reader(proto_schema(ORDER, "Order", "shop"), {}, "test")  # protoc compiles it
    assert message.name == "shop.Order" and message.indexes == (0,)
    fields = protobuf_rows.message_class(message.descriptor_set, message.name).DESCRIPTOR.fields_by_name
    assert fields["note"].has_presence and not fields["id"].has_presence  # a null note reads back as null


def test_nested_message_names_stay_unique_and_clear_of_map_entries():
    text = proto_schema(struct(field("a_b", struct(field("x", "long"))), field("A_b", struct(field("y", "long"))),
                               field("c", {"type": "map", "keyType": "long", "valueType": struct(field("z", "long")),
                                           "valueContainsNull": False})), "Root")
    assert "AB a_b = 1;" in text and "AB_ A_b = 2;" in text and "map<int64, C> c = 3;" in text
    assert "package" not in text and "import" not in text
    protobuf_reader(text, {}, "test")
    with pytest.raises(ConfigurationError, match="columns 'a_b' and 'aB' would have the same Protobuf JSON name"):
        proto_schema(struct(field("a_b", "long"), field("aB", "long")), "Root")


@pytest.mark.parametrize("kind, words", [
    ("decimal(10,2)", ["column 'col'", "Spark type decimal(10,2)", "cast it to STRING (exact) or to DOUBLE"]),
    ("date", ["column 'col'", "cast it to STRING"]),
    ("timestamp_ntz", ["column 'col'", "cast it to TIMESTAMP"]),
    ({"type": "array", "elementType": {"type": "array", "elementType": "long", "containsNull": True},
      "containsNull": True}, ["column 'col' has arrays as an array's elements", "wrap each in a struct"]),
    ({"type": "map", "keyType": "double", "valueType": "long", "valueContainsNull": True},
     ["column 'col' is a map keyed by double", "cast its keys"]),
    (struct(field("amount", "decimal(38,18)")), ["column 'col.amount'", "DOUBLE"]),
])
def test_types_without_a_clean_protobuf_form_are_refused_with_the_column_and_the_cast(kind, words):
    with pytest.raises(ConfigurationError) as caught:
        proto_schema(struct(field("id", "long"), field("col", kind)), "Order")
    for word in words:
        assert word in str(caught.value)
    assert "or give the sink a schema" in str(caught.value)


def test_a_column_name_protobuf_cannot_hold_or_a_bad_package_is_refused():
    with pytest.raises(ConfigurationError, match="column 'unit price' is not a Protobuf field name.*rename it"):
        proto_schema(struct(field("unit price", "double")), "Order")
    with pytest.raises(ConfigurationError, match="is not a Protobuf package"):
        proto_schema(struct(field("id", "long")), "Order", "shop-eu")


def _order_message():
    message = protobuf_reader(proto_schema(ORDER, "Order", "shop"), {}, "test")
    return message, json.dumps(ORDER)


def test_a_row_encodes_to_the_message_and_decodes_back_with_nulls_kept():
    message, spark_type = _order_message()
    at = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone.utc)
    local = datetime.datetime.fromtimestamp(at.timestamp())  # PySpark's naive local time of the instant
    row = (7, None, 3, ("a", 1.5), [("b",), (None,)], ["x", "y"], {"k": 2}, local, bytearray(b"\x00\x01"))
    data = protobuf_encode.encode(message.descriptor_set, message.name, spark_type, row)
    decoded = protobuf_rows.decode(message, b"\x00" + data, "error")
    assert decoded == {"id": 7, "note": None, "qty": 3, "line": {"sku": "a", "price": 1.5},
                       "lines": [{"sku": "b"}, {"sku": None}], "tags": ["x", "y"], "attrs": {"k": 2}, "at": at,
                       "raw": b"\x00\x01", "error": None}
    empty = protobuf_rows.decode(message, b"\x00" + protobuf_encode.encode(
        message.descriptor_set, message.name, spark_type, (0, "", None, None, None, None, None, None, None)), "error")
    assert (empty["note"], empty["qty"], empty["line"], empty["tags"], empty["at"]) == ("", None, None, [], None)


@pytest.mark.parametrize("index, value, words", [
    (5, ["x", None], "column 'tags' holds a null array element"),
    (6, {"k": None}, "column 'attrs' holds a map with a null value"),
])
def test_a_value_protobuf_cannot_hold_fails_naming_the_column(index, value, words):
    message, spark_type = _order_message()
    row = [1, None, None, None, None, None, None, None, None]
    row[index] = value
    with pytest.raises(ValueError, match=words):
        protobuf_encode.encode(message.descriptor_set, message.name, spark_type, tuple(row))


GIVEN = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Order { int64 id = 1; Status status = 2; Line line = 3; google.protobuf.Timestamp at = 4;
  enum Status { NEW = 0; PAID = 1; }
  message Line { string sku = 1; }
}
message Refund { int64 order_id = 1; }
"""


def test_columns_are_checked_against_a_given_message_before_any_record():
    message = protobuf_reader(GIVEN, {}, "test")
    fits = struct(field("id", "integer"), field("status", "string"), field("line", struct(field("sku", "string"))),
                  field("at", "timestamp"))
    protobuf_encode.check_columns(fits, message.descriptor_set, message.name, "value")  # int -> int64, str -> enum
    for columns, words in [
        (struct(field("id", "long"), field("extra", "string")),
         "the value column 'extra' is not a field of the Protobuf message shop.Order (its fields: id, status, line, at)"),
        (struct(field("id", "string")), "column 'id' (Spark string) cannot be written as the Protobuf field shop.Order.id"),
        (struct(field("line", "string")), "(Spark string) cannot be written as the Protobuf field shop.Order.line "
                                          "(shop.Order.Line)"),
        (struct(field("line", struct(field("qty", "long")))), "column 'line.qty' is not a field"),
        (struct(field("at", "long")), "google.protobuf.Timestamp"),
        (struct(field("id", "decimal(10,0)")), "column 'id' of Spark type decimal(10,0) cannot be written"),
    ]:
        with pytest.raises(ConfigurationError) as caught:
            protobuf_encode.check_columns(columns, message.descriptor_set, message.name, "value")
        assert words in str(caught.value)
    data = protobuf_encode.encode(message.descriptor_set, message.name, json.dumps(fits), (5, "PAID", ("a",), None))
    assert protobuf_rows.decode(message, b"\x00" + data, "e")["status"] == "PAID"


def test_the_sink_writes_protobuf_under_the_topic_or_the_message_name():
    [value] = part_writers({"topic": "orders", "value_format": "protobuf"})
    derived = value.derived_schema(struct(field("id", "long", nullable=False)))
    assert "message orders_value {" in derived and value.subject(derived) == "orders-value"
    by_record = part_writers({"topic": "orders", "value_format": "protobuf", "subject_name_strategy": "record",
                              "record_name": "shop.v1.Order"})[0]
    derived = by_record.derived_schema(struct(field("id", "long")))
    assert "package shop.v1;" in derived and by_record.subject(derived) == "shop.v1.Order"
    # a given .proto: its first message, or the one record_name names
    given = part_writers({"topic": "orders", "value_format": "protobuf", "value_schema": GIVEN,
                          "subject_name_strategy": "record"})[0]
    assert given.subject(GIVEN) == "shop.Order" and given.message(GIVEN).indexes == (0,)
    refund = part_writers({"topic": "orders", "value_format": "protobuf", "value_schema": GIVEN,
                           "subject_name_strategy": "record", "record_name": "shop.Refund"})[0]
    assert refund.subject(GIVEN) == "shop.Refund" and refund.message(GIVEN).indexes == (1,)
    with pytest.raises(ConfigurationError, match="does not compile"):
        given.message("syntax = 'proto3'; message {")
