"""Spark rows as Protobuf messages, with the protobuf runtime: what the Kafka sink writes for value_format="protobuf".

The reverse of records.protobuf_rows, for the same reason (Spark's `to_protobuf` is in the
spark-protobuf package, which the package index does not serve): a Python UDF on the executors
turns each row of the part's struct into the writer message of the compiled descriptor set the
driver ships, and serializes it. The driver first checks that every column has a field of a type
it can be written as (`check_columns`), so that a mismatch is a configuration error naming the
column before any record is written, not a failure inside a Spark task.
"""

from __future__ import annotations

import datetime
import json
import threading
from typing import Any, Callable

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.records.protobuf_rows import message_class

_CONVERTERS: dict[str, Callable[[Any], dict[str, Any]]] = {}  # Spark type (JSON) -> row converter, per process
_LOCK = threading.Lock()
_TIMESTAMP = "google.protobuf.Timestamp"
_MESSAGE, _ENUM = 11, 14
_INTEGERS = {3, 4, 5, 6, 7, 13, 15, 16, 17, 18}  # every integer field type (FieldDescriptor.TYPE_*)
# The field types a Spark scalar column may be written as.
_WRITABLE = {"string": {9, _ENUM}, "binary": {12}, "boolean": {8}, "float": {1, 2}, "double": {1, 2},
             "byte": _INTEGERS | {_ENUM}, "short": _INTEGERS | {_ENUM}, "integer": _INTEGERS | {_ENUM},
             "long": _INTEGERS | {_ENUM}}
_TYPE_NAMES = {1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 7: "fixed32", 8: "bool",
               9: "string", 10: "group", 11: "message", 12: "bytes", 13: "uint32", 14: "enum", 15: "sfixed32",
               16: "sfixed64", 17: "sint32", 18: "sint64"}


def check_columns(spark_type: dict[str, Any], descriptor_set: bytes, name: str, part: str) -> None:
    """Every column of the struct `spark_type` (Spark's JSON form) is a field of message `name` that it can be
    written as; else a ConfigurationError naming the column and the fix."""
    _check_struct(spark_type, message_class(descriptor_set, name).DESCRIPTOR, part, "")


def _check_struct(struct: dict[str, Any], descriptor: Any, part: str, path: str) -> None:
    for column in struct["fields"]:
        column_path = f"{path}{column['name']}"
        fd = descriptor.fields_by_name.get(column["name"])
        if fd is None:
            raise ConfigurationError(
                f"kafka sink: the {part} column {column_path!r} is not a field of the Protobuf message "
                f"{descriptor.full_name} (its fields: {', '.join(f.name for f in descriptor.fields) or 'none'}): "
                "drop or rename the column, or write with a schema that has the field")
        _check_field(column["type"], fd, part, column_path)


def _check_field(kind: Any, fd: Any, part: str, path: str) -> None:
    is_map = fd.type == _MESSAGE and fd.message_type.GetOptions().map_entry
    if isinstance(kind, dict) and kind["type"] == "map":
        if not is_map:
            _mismatch(kind, fd, part, path)
        entry = fd.message_type
        _check_single(kind["keyType"], entry.fields_by_name["key"], part, f"{path} (its keys)")
        _check_single(kind["valueType"], entry.fields_by_name["value"], part, f"{path} (its values)")
    elif isinstance(kind, dict) and kind["type"] == "array":
        if not fd.is_repeated or is_map:
            _mismatch(kind, fd, part, path)
        _check_single(kind["elementType"], fd, part, f"{path} (its elements)")
    else:
        if fd.is_repeated:
            _mismatch(kind, fd, part, path)
        _check_single(kind, fd, part, path)


def _check_single(kind: Any, fd: Any, part: str, path: str) -> None:
    if isinstance(kind, dict) and kind["type"] == "struct":
        if fd.type != _MESSAGE or fd.message_type.full_name == _TIMESTAMP or fd.message_type.GetOptions().map_entry:
            _mismatch(kind, fd, part, path)
        _check_struct(kind, fd.message_type, part, path.split(" ")[0] + ".")
    elif kind == "timestamp":
        if fd.type != _MESSAGE or fd.message_type.full_name != _TIMESTAMP:
            _mismatch(kind, fd, part, path)
    elif isinstance(kind, str) and kind in _WRITABLE:
        if fd.type not in _WRITABLE[kind]:
            _mismatch(kind, fd, part, path)
    else:
        shown = kind if isinstance(kind, str) else kind["type"]
        raise ConfigurationError(f"kafka sink: the {part} column {path!r} of Spark type {shown} cannot be written in "
                                 f"Protobuf: cast it (e.g. to STRING, DOUBLE or TIMESTAMP) to the type of field "
                                 f"{fd.full_name}")


def _mismatch(kind: Any, fd: Any, part: str, path: str) -> None:
    shown = kind if isinstance(kind, str) else kind["type"]
    field_type = fd.message_type.full_name if fd.type == _MESSAGE else _TYPE_NAMES.get(fd.type, str(fd.type))
    label = "repeated " if fd.is_repeated else ""
    raise ConfigurationError(f"kafka sink: the {part} column {path!r} (Spark {shown}) cannot be written as the "
                             f"Protobuf field {fd.full_name} ({label}{field_type}): cast the column to the field's "
                             "type, or change the schema")


def encode(descriptor_set: bytes, name: str, spark_type: str, row: Any) -> bytes | None:
    """One row of the struct `spark_type` (Spark's JSON of the type) as message `name`, serialized; runs in the
    executors' Python. A value Protobuf cannot hold (a null array element, an int32 out of range) fails the
    write with the column named."""
    if row is None:
        return None
    with _LOCK:
        convert = _CONVERTERS.get(spark_type)
    if convert is None:
        convert = _struct(json.loads(spark_type), "")
        with _LOCK:
            _CONVERTERS[spark_type] = convert
    try:
        return message_class(descriptor_set, name)(**convert(row)).SerializeToString()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"kafka sink: a row cannot be written as the Protobuf message {name}: {exc}") from exc


def _struct(struct: dict[str, Any], path: str) -> Callable[[Any], dict[str, Any]]:
    fields = [(f["name"], _converter(f["type"], f"{path}{f['name']}")) for f in struct["fields"]]

    def convert(row: Any) -> dict[str, Any]:
        out = {}
        for (name, field_converter), value in zip(fields, row):
            if value is not None:  # an unset field: null for an `optional` one, the default else
                out[name] = value if field_converter is None else field_converter(value)
        return out

    return convert


def _converter(kind: Any, path: str) -> Callable[[Any], Any] | None:
    """How a Spark value becomes what the message's constructor takes (None: as it is)."""
    if kind == "timestamp":
        return _timestamp
    if kind == "binary":  # PySpark gives a bytearray; a bytes field takes bytes
        return bytes
    if not isinstance(kind, dict):
        return None
    if kind["type"] == "struct":
        return _struct(kind, f"{path}.")
    if kind["type"] == "array":
        element = _converter(kind["elementType"], path)

        def array(values: Any) -> list[Any]:
            if any(v is None for v in values):
                raise ValueError(f"column {path!r} holds a null array element, which a repeated Protobuf field "
                                 f"cannot hold: drop them (array_compact({path})) or replace them (coalesce)")
            return list(values) if element is None else [element(v) for v in values]

        return array
    if kind["type"] == "map":
        value_converter = _converter(kind["valueType"], path)

        def mapping(values: Any) -> dict[Any, Any]:
            if any(v is None for v in values.values()):
                raise ValueError(f"column {path!r} holds a map with a null value, which a Protobuf map cannot hold: "
                                 f"drop them (map_filter({path}, (k, v) -> v IS NOT NULL)) or replace them")
            return dict(values) if value_converter is None else {k: value_converter(v) for k, v in values.items()}

        return mapping
    return None


def _timestamp(value: datetime.datetime) -> dict[str, int]:
    """A Spark timestamp (PySpark gives a naive datetime in the worker's local time) as a Timestamp's fields;
    `timestamp()` reverses that local time exactly, the whole seconds apart from the microseconds."""
    return {"seconds": int(value.replace(microsecond=0).timestamp()), "nanos": value.microsecond * 1000}
