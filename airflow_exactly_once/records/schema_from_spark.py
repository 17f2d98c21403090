"""The schema a Spark column is written with when the user gives none: Avro, JSON Schema or Protobuf from a Spark type.

The Kafka sink writes records in the Schema Registry wire format under a schema registered in
the registry; without a schema in the sink spec it is derived from the output DataFrame's type
(given here as Spark's JSON form of the type, `DataType.jsonValue()`, so that this stays pure).
The Avro mapping is the one Spark's `to_avro` uses: a nullable column is a union with null
first (default null), timestamps are timestamp-micros longs, dates ints, decimals fixed-scale
bytes; nested structs become records named after their path so that names stay unique.
The Protobuf mapping (proto3) is in `proto_schema`: only types with one clean Protobuf form are
derived; the others are refused with the cast that makes them writable.
"""

from __future__ import annotations

import re
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError

_AVRO_PRIMITIVES = {"string": "string", "binary": "bytes", "boolean": "boolean", "integer": "int", "short": "int",
                    "byte": "int", "long": "long", "float": "float", "double": "double"}
_JSON_PRIMITIVES = {"string": "string", "boolean": "boolean", "integer": "integer", "short": "integer",
                    "byte": "integer", "long": "integer", "float": "number", "double": "number",
                    "timestamp": "string", "timestamp_ntz": "string", "date": "string"}


def avro_name(text: str) -> str:
    """A valid Avro name from any text (a topic, a column): letters, digits and '_', not starting with a digit."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return name if name and not name[0].isdigit() else f"_{name}"


def avro_schema(spark_type: dict[str, Any] | str, name: str, namespace: str | None = None) -> dict[str, Any]:
    """The Avro schema of a Spark type (a struct becomes a record called `name`)."""
    schema = _avro(spark_type, avro_name(name), set())
    if isinstance(schema, dict) and schema.get("type") == "record" and namespace:
        schema["namespace"] = namespace
    return schema


def _avro(spark_type: Any, name: str, names: set[str]) -> Any:
    if isinstance(spark_type, str):
        if spark_type in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[spark_type]
        if spark_type == "timestamp":
            return {"type": "long", "logicalType": "timestamp-micros"}
        if spark_type == "timestamp_ntz":
            return {"type": "long", "logicalType": "local-timestamp-micros"}
        if spark_type == "date":
            return {"type": "int", "logicalType": "date"}
        match = re.fullmatch(r"decimal\((\d+),\s*(\d+)\)", spark_type)
        if match:
            return {"type": "bytes", "logicalType": "decimal", "precision": int(match[1]), "scale": int(match[2])}
        raise ConfigurationError(f"a column of Spark type {spark_type!r} has no Avro type to write it as; cast it "
                                 "(e.g. to string) or give the sink a schema")
    kind = spark_type["type"]
    if kind == "struct":
        if name in names:
            raise ConfigurationError(f"two nested records would both be named {name!r}; give the sink a schema")
        names.add(name)
        fields = []
        for field in spark_type["fields"]:
            inner = _avro(field["type"], f"{name}_{avro_name(field['name'])}", names)
            if field.get("nullable", True):
                fields.append({"name": field["name"], "type": ["null", inner], "default": None})
            else:
                fields.append({"name": field["name"], "type": inner})
        return {"type": "record", "name": name, "fields": fields}
    if kind == "array":
        inner = _avro(spark_type["elementType"], name, names)
        return {"type": "array", "items": ["null", inner] if spark_type.get("containsNull") else inner}
    if kind == "map":
        if spark_type["keyType"] != "string":
            raise ConfigurationError(f"Avro maps have string keys; a map keyed by {spark_type['keyType']} cannot be "
                                     "written: cast its keys to string or give the sink a schema")
        inner = _avro(spark_type["valueType"], name, names)
        return {"type": "map", "values": ["null", inner] if spark_type.get("valueContainsNull") else inner}
    raise ConfigurationError(f"a column of Spark type {kind!r} has no Avro type; give the sink a schema")


def json_schema(spark_type: dict[str, Any] | str, title: str | None = None) -> dict[str, Any]:
    """The JSON Schema (draft-07) of a Spark type, as Spark's to_json writes its values."""
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", **_json(spark_type)}
    if title:
        schema["title"] = title
    return schema


def _json(spark_type: Any) -> dict[str, Any]:
    if isinstance(spark_type, str):
        if spark_type in _JSON_PRIMITIVES:
            return {"type": _JSON_PRIMITIVES[spark_type]}
        if spark_type.startswith("decimal"):
            return {"type": "number"}
        raise ConfigurationError(f"a column of Spark type {spark_type!r} has no JSON type to write it as; cast it "
                                 "or give the sink a schema")
    kind = spark_type["type"]
    if kind == "struct":
        properties = {}
        for field in spark_type["fields"]:
            inner = _json(field["type"])
            if field.get("nullable", True):
                inner = {**inner, "type": ["null", inner["type"]]}
            properties[field["name"]] = inner
        return {"type": "object", "properties": properties, "additionalProperties": False}
    if kind == "array":
        return {"type": "array", "items": _json(spark_type["elementType"])}
    if kind == "map":
        return {"type": "object", "additionalProperties": _json(spark_type["valueType"])}
    raise ConfigurationError(f"a column of Spark type {kind!r} has no JSON type; give the sink a schema")


# Spark types with one Protobuf scalar type; byte and short widen to int32 (Protobuf has nothing smaller).
_PROTO_SCALARS = {"string": "string", "binary": "bytes", "boolean": "bool", "integer": "int32", "short": "int32",
                  "byte": "int32", "long": "int64", "float": "float", "double": "double"}
_PROTO_MAP_KEYS = ("string", "boolean", "integer", "short", "byte", "long")
_PROTO_TIMESTAMP = "google.protobuf.Timestamp"
_PROTO_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PROTO_REFUSED = {
    "timestamp_ntz": "has no time zone, and google.protobuf.Timestamp is an instant: cast it to TIMESTAMP (it is then "
                     "read in the session time zone) or to STRING",
    "date": "has no Protobuf type without an import the registry may not hold: cast it to STRING (ISO date) or to "
            "TIMESTAMP",
    "decimal": "has no exact Protobuf type: cast it to STRING (exact) or to DOUBLE",
}


def proto_schema(spark_type: dict[str, Any] | str, message_name: str, package: str | None = None) -> str:
    """The .proto text (proto3) of a Spark struct type: one message `message_name`, one field per column in order.

    Nullable scalars are `optional` (so that a null reads back as null, not as 0 or ""), structs nested
    messages, arrays repeated fields, maps map<> fields, timestamps google.protobuf.Timestamp. A null
    array or map is written as an empty one (Protobuf has no null repeated field).
    """
    if isinstance(spark_type, str) or spark_type.get("type") != "struct":
        raise ConfigurationError(f"a Protobuf message is derived from a struct, not from Spark type {spark_type!r}")
    if package is not None and not all(_PROTO_IDENTIFIER.fullmatch(p) for p in package.split(".")):
        raise ConfigurationError(f"{package!r} is not a Protobuf package (dot-separated names of letters, digits "
                                 "and '_'): give record_name as 'package.Message'")
    lines: list[str] = []
    uses_timestamp = _proto_message(spark_type, avro_name(message_name), "", lines, "")
    head = ['syntax = "proto3";']
    if package:
        head.append(f"package {package};")
    if uses_timestamp:
        head.append('import "google/protobuf/timestamp.proto";')
    return "\n".join(head) + "\n\n" + "\n".join(lines) + "\n"


def _proto_message(struct: dict[str, Any], name: str, indent: str, lines: list[str], path: str) -> bool:
    """Append message `name` for a struct type to `lines`; True when it (or a nested one) uses a Timestamp."""
    nested: list[str] = []
    taken = {name}  # nested message names in this scope (and the map entries protoc generates)
    uses_timestamp = False
    body = []
    json_names: dict[str, str] = {}
    for number, column in enumerate(struct["fields"], start=1):
        field_name, column_path = column["name"], f"{path}{column['name']}"
        if not _PROTO_IDENTIFIER.fullmatch(field_name):
            raise ConfigurationError(f"column {column_path!r} is not a Protobuf field name (letters, digits and "
                                     "'_', not starting with a digit): rename it (e.g. `AS my_col`) or give the "
                                     "sink a schema")
        json_name = re.sub(r"_+([A-Za-z0-9]?)", lambda m: m[1].upper(), field_name)  # as protoc derives it
        if json_name in json_names:
            raise ConfigurationError(f"columns {path}{json_names[json_name]!r} and {column_path!r} would have the "
                                     f"same Protobuf JSON name {json_name!r}, which protoc refuses: rename one")
        json_names[json_name] = field_name
        kind = column["type"]
        label = ""
        if isinstance(kind, dict) and kind["type"] == "map":
            taken.add(_camel(field_name) + "Entry")
            key = kind["keyType"]
            if key not in _PROTO_MAP_KEYS:
                raise ConfigurationError(f"column {column_path!r} is a map keyed by {key}: Protobuf map keys are "
                                         "strings, integers or booleans; cast its keys (e.g. to STRING) or give the "
                                         "sink a schema")
            value, timestamp = _proto_type(kind["valueType"], field_name, indent, nested, taken, column_path,
                                           "a map's values")
            type_text = f"map<{_PROTO_SCALARS[key]}, {value}>"
        elif isinstance(kind, dict) and kind["type"] == "array":
            type_text, timestamp = _proto_type(kind["elementType"], field_name, indent, nested, taken, column_path,
                                               "an array's elements")
            label = "repeated "
        else:
            type_text, timestamp = _proto_type(kind, field_name, indent, nested, taken, column_path, None)
            if column.get("nullable", True) and isinstance(kind, str) and kind in _PROTO_SCALARS:
                label = "optional "
        uses_timestamp |= timestamp
        body.append(f"{indent}  {label}{type_text} {field_name} = {number};")
    lines.append(f"{indent}message {name} {{")
    lines.extend(body)
    if nested:
        lines.append("")
        lines.extend(nested)
    lines.append(f"{indent}}}")
    return uses_timestamp


def _proto_type(kind: Any, field_name: str, indent: str, nested: list[str], taken: set[str], path: str,
                inside: str | None) -> tuple[str, bool]:
    """The Protobuf type of one value (a field's, an array element's, a map value's), and whether it is a
    Timestamp; a struct adds its nested message to `nested`."""
    if isinstance(kind, str):
        if kind in _PROTO_SCALARS:
            return _PROTO_SCALARS[kind], False
        if kind == "timestamp":
            return _PROTO_TIMESTAMP, True
        reason = _PROTO_REFUSED.get("decimal" if kind.startswith("decimal") else kind)
        if reason is None:
            reason = "has no Protobuf type to write it as: cast it (e.g. to STRING)"
        raise ConfigurationError(f"column {path!r} of Spark type {kind} {reason}, or give the sink a schema")
    if kind["type"] == "struct":
        name = _camel(field_name)
        while name in taken:
            name += "_"
        taken.add(name)
        timestamp = _proto_message(kind, name, indent + "  ", nested, f"{path}.")
        return name, timestamp
    if kind["type"] in ("array", "map") and inside:
        raise ConfigurationError(f"column {path!r} has {kind['type']}s as {inside}, which Protobuf cannot hold: "
                                 f"wrap each in a struct (e.g. `transform({path}, x -> named_struct('items', x))`) "
                                 "or give the sink a schema")
    raise ConfigurationError(f"column {path!r} of Spark type {kind['type']} has no Protobuf type: cast it (e.g. to "
                             "STRING) or give the sink a schema")


def _camel(field_name: str) -> str:
    """A nested message's name from its field's: order_line -> OrderLine."""
    return "".join(part[:1].upper() + part[1:] for part in field_name.split("_") if part) or "Field"
