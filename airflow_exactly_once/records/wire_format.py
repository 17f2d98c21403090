"""The Confluent Schema Registry wire format: what the bytes of a record say before any schema is known.

A value (or key) in the wire format is one zero "magic" byte, the writer schema's registry id
as a 4-byte big-endian integer, then the data: Avro binary, or Protobuf message indexes and
the message, or JSON text. The Spark job reads ids with SQL on the bytes (spark.records); this
module is what the driver and the tests need: the layout, framing, and the Protobuf message
indexes (a zigzag-varint array saying which message of the .proto file the data is).
"""

from __future__ import annotations

import struct

MAGIC = 0
HEADER = 5  # magic byte + schema id
# What `value_format` / `key_format` may name that reads the wire format through a registry.
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")
# The Confluent "schemaType" of each, as the registry names it.
SCHEMA_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF", "json_schema": "JSON"}


def frame(schema_id: int, data: bytes) -> bytes:
    """`data` in the wire format under the schema with registry id `schema_id`."""
    return struct.pack(">bI", MAGIC, schema_id) + data


def schema_id(value: bytes) -> int | None:
    """The writer schema id of a value in the wire format, None when the value is not in it."""
    if value is None or len(value) < HEADER or value[0] != MAGIC:
        return None
    return struct.unpack(">I", value[1:HEADER])[0]


def zigzag_varint(number: int) -> bytes:
    """A zigzag varint, as Avro encodes ints and longs and Protobuf's wire format its message indexes."""
    value = (number << 1) ^ (number >> 63)
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def message_indexes(indexes: list[int]) -> bytes:
    """The Protobuf message-index prefix: [0] (the file's first message) is the single byte 0."""
    if indexes == [0]:
        return b"\x00"
    return zigzag_varint(len(indexes)) + b"".join(zigzag_varint(i) for i in indexes)


def read_message_indexes(data: bytes) -> tuple[list[int], int]:
    """The message indexes at the start of Protobuf data in the wire format, and where the message starts."""
    position = 0

    def varint() -> int:
        nonlocal position
        shift = result = 0
        while True:
            if position >= len(data):
                raise ValueError("truncated message indexes")
            byte = data[position]
            position += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)
            shift += 7
            if shift > 63:
                raise ValueError("a message index longer than a varint")

    count = varint()
    if count == 0:
        return [0], position
    if count < 0 or count > 100:
        raise ValueError(f"{count} message indexes")
    return [varint() for _ in range(count)], position
