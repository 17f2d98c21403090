"""The pure parts of reading Protobuf in the Schema Registry wire format: compiling the reader's .proto with its
imports, choosing the message and its indexes, the Spark columns, and decoding one record's data."""

from __future__ import annotations

import datetime

import pytest

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.records import protobuf_rows
from airflow_exactly_once.records.protobuf_schema import compile_proto, reader_message
from airflow_exactly_once.records.registry import protobuf_reader
from airflow_exactly_once.records.wire_format import message_indexes

COMMON = 'syntax = "proto3";\npackage shop.common;\nmessage Money { string currency = 1; sint64 cents = 2; }\n'
ORDER = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "shop/common.proto";
message Order {
  int64 id = 1;
  Status status = 2;
  Line line = 3;
  map<string, int32> qty = 4;
  google.protobuf.Timestamp at = 5;
  optional string note = 6;
  uint64 big = 7;
  shop.common.Money total = 8;
  enum Status { NEW = 0; PAID = 1; }
  message Line { string sku = 1; }
}
message Refund { int64 order_id = 1; }
"""
ERROR = "_err"


def _order() -> protobuf_rows.ProtobufMessage:
    return protobuf_reader(ORDER, {"shop/common.proto": COMMON}, "subject 'orders-value' version 1")


def test_a_proto_with_nested_messages_and_imports_compiles_to_the_first_messages_columns():
    message = _order()
    assert (message.name, message.indexes) == ("shop.Order", (0,))
    # a map's entry is a nested message too, as in the descriptors a Confluent producer numbers from
    assert message.names_by_indexes == {(0,): "shop.Order", (0, 0): "shop.Order.QtyEntry",
                                        (0, 1): "shop.Order.Line", (1,): "shop.Refund"}
    assert protobuf_rows.spark_ddl(message) == (
        "`id` BIGINT, `status` STRING, `line` STRUCT<`sku`: STRING>, `qty` MAP<STRING, INT>, `at` TIMESTAMP, "
        "`note` STRING, `big` DECIMAL(20,0), `total` STRUCT<`currency`: STRING, `cents`: BIGINT>")
    assert reader_message(message.descriptor_set, "x", "shop.Order.Line").indexes == (0, 1)
    assert reader_message(message.descriptor_set, "x", ".shop.Refund").indexes == (1,)
    with pytest.raises(ConfigurationError, match="has no message 'shop.Invoice'; its messages: shop.Order, "):
        reader_message(message.descriptor_set, "x", "shop.Invoice")


def test_compiled_sets_are_cached_per_schema_text():
    assert compile_proto(ORDER, {"shop/common.proto": COMMON}, "a") is compile_proto(
        ORDER, {"shop/common.proto": COMMON}, "b")


@pytest.mark.parametrize("text, imports, says", [
    ('syntax = "proto3";\nmessage A { int32 x = 1 }\n', {}, 'line 2:25: Expected ";"'),
    (ORDER, {}, "shop/common.proto: File not found"),
    ('syntax = "proto3";\nenum E { A = 0; }\n', {}, "defines no message"),
])
def test_a_schema_that_does_not_compile_names_the_subject_and_protocs_reason(text, imports, says):
    with pytest.raises(ConfigurationError) as raised:
        protobuf_reader(text, imports, "subject 'orders-value' version 3")
    assert "the Protobuf schema (subject 'orders-value' version 3)" in str(raised.value)
    assert says in str(raised.value)
    assert "aeo-proto-" not in str(raised.value)  # protoc's temporary folder is not part of the message


def test_an_import_path_may_not_leave_the_compile_folder():
    with pytest.raises(ConfigurationError, match="must stay relative"):
        compile_proto(ORDER, {"../common.proto": COMMON}, "s")


def test_a_recursive_message_has_no_spark_type():
    message = protobuf_reader('syntax = "proto3";\nmessage Node { Node next = 1; }\n', {}, "s")
    with pytest.raises(ConfigurationError, match=r"recursive \(Node -> Node\)"):
        protobuf_rows.spark_ddl(message)


def test_data_decodes_to_the_readers_row_and_bad_data_says_why():
    message = _order()
    cls = protobuf_rows.message_class(message.descriptor_set, "shop.Order")
    order = cls(id=5, status=1, line={"sku": "s"}, at={"seconds": 10}, big=2 ** 64 - 1,
                total={"currency": "EUR", "cents": -250})
    order.qty["x"] = 3
    data = message_indexes([0]) + order.SerializeToString()
    row = protobuf_rows.decode(message, data, ERROR)
    assert row == {"id": 5, "status": "PAID", "line": {"sku": "s"}, "qty": {"x": 3},
                   "at": datetime.datetime(1970, 1, 1, 0, 0, 10, tzinfo=datetime.timezone.utc), "note": None,
                   "big": 2 ** 64 - 1, "total": {"currency": "EUR", "cents": -250}, ERROR: None}
    assert protobuf_rows.decode(message, message_indexes([0]), ERROR)["id"] == 0  # proto3: absent is the default
    assert protobuf_rows.decode(message, None, ERROR) is None
    assert "truncated or corrupt Protobuf data of message shop.Order" in \
        protobuf_rows.decode(message, data[:-3], ERROR)[ERROR]
    assert protobuf_rows.decode(message, message_indexes([0, 1]) + b"", ERROR)[ERROR] == \
        "Protobuf data of message indexes [0, 1] (message shop.Order.Line), not the reader's message shop.Order [0]"
    assert "(no message of the reader's file)" in protobuf_rows.decode(message, message_indexes([4]), ERROR)[ERROR]
    assert "truncated or corrupt Protobuf message indexes" in protobuf_rows.decode(message, b"\x04\x02", ERROR)[ERROR]


def test_fields_a_writer_lacks_or_the_reader_lacks_follow_the_field_numbers():
    old = protobuf_reader('syntax = "proto3";\npackage shop;\nmessage Order { int64 id = 1; string gone = 9; }\n',
                          {}, "v1")
    data = protobuf_rows.message_class(old.descriptor_set, "shop.Order")(id=7, gone="x").SerializeToString()
    row = protobuf_rows.decode(_order(), b"\x00" + data, ERROR)
    assert (row["id"], row["note"], row["status"], row["line"], row[ERROR]) == (7, None, "NEW", None, None)
