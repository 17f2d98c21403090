"""The schema a Spark column is written with when the user gives none: Avro or JSON Schema from a Spark type.

The Kafka sink writes records in the Schema Registry wire format under a schema registered in
the registry; without a schema in the sink spec it is derived from the output DataFrame's type
(given here as Spark's JSON form of the type, `DataType.jsonValue()`, so that this stays pure).
The Avro mapping is the one Spark's `to_avro` uses: a nullable column is a union with null
first (default null), timestamps are timestamp-micros longs, dates ints, decimals fixed-scale
bytes; nested structs become records named after their path so that names stay unique.
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
