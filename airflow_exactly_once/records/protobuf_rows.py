"""Protobuf data in the Schema Registry wire format as Spark rows, with the protobuf runtime.

Spark's own `from_protobuf` lives in the spark-protobuf package, which the package index this
project builds against does not serve for any Spark release; the protobuf runtime (a dependency
of confluent-kafka's registry client, and of pyspark's Spark Connect client) decodes the same
data on the executors instead, from the reader's compiled descriptor set. Only this module runs
there: it needs google.protobuf, not the compiler (records.protobuf_schema).

The reader's message decodes the data of every writer version: Protobuf evolves by field
numbers, so fields a writer lacks read as their defaults (or null when the field tracks
presence) and fields the reader lacks are skipped. A record whose message indexes name another
message of the file, or whose data is truncated or corrupt, is bad with that reason.
"""

from __future__ import annotations

import datetime
import decimal
import threading
from dataclasses import dataclass, field
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.records.wire_format import read_message_indexes

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_CLASSES: dict[tuple[bytes, str], Any] = {}  # (descriptor set, message) -> message class, per process
_LOCK = threading.Lock()


@dataclass(frozen=True)
class ProtobufMessage:
    """The reader's message: its compiled file with imports (a serialized FileDescriptorSet), the message's
    full name, and its message indexes in the file (what the wire format's prefix says for it)."""

    descriptor_set: bytes
    name: str
    indexes: tuple[int, ...] = (0,)
    names_by_indexes: dict[tuple[int, ...], str] = field(default_factory=dict, compare=False)


def message_class(descriptor_set: bytes, name: str) -> Any:
    """The protobuf runtime's class of message `name` in a serialized FileDescriptorSet (built once per process)."""
    key = (descriptor_set, name)
    with _LOCK:
        if key in _CLASSES:
            return _CLASSES[key]
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:  # protoc lists a file after its imports
        pool.Add(proto)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    with _LOCK:
        _CLASSES[key] = cls
    return cls


# Spark types of the scalar field types (FieldDescriptor.TYPE_*); unsigned 32-bit values need BIGINT, unsigned
# 64-bit ones DECIMAL(20, 0), as Spark's upcast.unsigned.ints does.
_SCALARS = {1: "DOUBLE", 2: "FLOAT", 3: "BIGINT", 4: "DECIMAL(20,0)", 5: "INT", 6: "DECIMAL(20,0)", 7: "BIGINT",
            8: "BOOLEAN", 9: "STRING", 12: "BINARY", 13: "BIGINT", 14: "STRING", 15: "INT", 16: "BIGINT",
            17: "INT", 18: "BIGINT"}
_UNSIGNED_64 = (4, 6)  # uint64, fixed64
_MESSAGE, _ENUM = 11, 14
_TIMESTAMP = "google.protobuf.Timestamp"


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _is_map(fd: Any) -> bool:
    return fd.type == _MESSAGE and fd.message_type.GetOptions().map_entry


def _field_type(fd: Any, seen: tuple[str, ...]) -> str:
    if _is_map(fd):
        key, value = fd.message_type.fields_by_name["key"], fd.message_type.fields_by_name["value"]
        return f"MAP<{_single_type(key, seen)}, {_single_type(value, seen)}>"
    single = _single_type(fd, seen)
    return f"ARRAY<{single}>" if fd.is_repeated else single


def _single_type(fd: Any, seen: tuple[str, ...]) -> str:
    if fd.type != _MESSAGE:
        return _SCALARS[fd.type]
    if fd.message_type.full_name == _TIMESTAMP:
        return "TIMESTAMP"
    return f"STRUCT<{_struct_fields(fd.message_type, seen, ': ')}>"


def _struct_fields(descriptor: Any, seen: tuple[str, ...], separator: str) -> str:
    if descriptor.full_name in seen:
        raise ConfigurationError(f"the Protobuf message {seen[0]} is recursive ({' -> '.join(seen)} -> "
                                 f"{descriptor.full_name}): Spark columns have a fixed depth; read the part as "
                                 "bytes and decode it in the transform")
    seen = (*seen, descriptor.full_name)
    return ", ".join(f"{_quoted(fd.name)}{separator}{_field_type(fd, seen)}" for fd in descriptor.fields)


def spark_ddl(message: ProtobufMessage) -> str:
    """The Spark columns (a DDL list, one per field) the reader's message decodes to."""
    descriptor = message_class(message.descriptor_set, message.name).DESCRIPTOR
    return _struct_fields(descriptor, (), " ")


def _value(fd: Any, value: Any) -> Any:
    if fd.type == _MESSAGE:
        if fd.message_type.full_name == _TIMESTAMP:
            return _EPOCH + datetime.timedelta(seconds=value.seconds, microseconds=value.nanos // 1000)
        return _row(value)
    if fd.type == _ENUM:
        known = fd.enum_type.values_by_number.get(value)
        return known.name if known is not None else str(value)  # a number this reader's enum lacks
    if fd.type in _UNSIGNED_64:
        return decimal.Decimal(value)
    return value


def _row(message: Any) -> dict[str, Any]:
    """A message as the dict Spark takes for its struct: a field with presence that is not set is null."""
    row: dict[str, Any] = {}
    for fd in message.DESCRIPTOR.fields:
        value = getattr(message, fd.name)
        if _is_map(fd):
            value_fd = fd.message_type.fields_by_name["value"]
            row[fd.name] = {k: _value(value_fd, v) for k, v in value.items()}
        elif fd.is_repeated:
            row[fd.name] = [_value(fd, v) for v in value]
        elif fd.has_presence and not message.HasField(fd.name):
            row[fd.name] = None
        else:
            row[fd.name] = _value(fd, value)
    return row


def decode(message: ProtobufMessage, payload: bytes | None, error: str) -> dict[str, Any] | None:
    """The data after a wire-format header (message indexes, then the message) as the reader's row, with the
    field `error`: null when it decoded, else why not. None for no payload (the caller says why)."""
    if payload is None:
        return None
    try:
        indexes, start = read_message_indexes(bytes(payload))
    except ValueError as exc:
        return {error: f"truncated or corrupt Protobuf message indexes ({exc})"}
    if tuple(indexes) != message.indexes:
        named = message.names_by_indexes.get(tuple(indexes))
        what = f"message {named}" if named else "no message of the reader's file"
        return {error: f"Protobuf data of message indexes {indexes} ({what}), not the reader's message "
                              f"{message.name} {list(message.indexes)}"}
    from google.protobuf.message import DecodeError

    cls = message_class(message.descriptor_set, message.name)
    try:
        parsed = cls.FromString(bytes(payload[start:]))
    except (DecodeError, RuntimeError, ValueError) as exc:
        return {error: f"truncated or corrupt Protobuf data of message {message.name} ({exc})"}
    row = _row(parsed)
    row[error] = None
    return row
