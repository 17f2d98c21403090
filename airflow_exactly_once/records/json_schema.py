"""A JSON Schema (the registry's reader schema of value_format="json_schema") as the Spark type it decodes to.

Spark's `from_json` needs a Spark schema; the registry holds a JSON Schema. Objects with
`properties` become structs, `additionalProperties` alone a map, arrays arrays, integer BIGINT,
number DOUBLE; a `["null", T]` type is T (Spark columns are nullable); local `$ref`s
(`#/definitions/X`, `#/$defs/X`) are followed. What has no single Spark type (`oneOf`, `anyOf`, a
list of several types) is kept as its JSON text in a STRING column. `required` properties that
cannot be null are checked after decoding (spark.records): a record without one is bad.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError

SCALARS = {"integer": "BIGINT", "number": "DOUBLE", "string": "STRING", "boolean": "BOOLEAN"}


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class _Converter:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root

    def follow(self, node: dict[str, Any], depth: int = 0) -> dict[str, Any]:
        ref = node.get("$ref")
        if ref is None:
            return node
        if not ref.startswith("#/") or depth > 32:
            raise ConfigurationError(f"the JSON Schema's $ref {ref!r} is not a local reference this reader follows "
                                     "(#/definitions/... or #/$defs/...); inline it, or read the value as string")
        target: Any = self.root
        for key in ref[2:].split("/"):
            target = target.get(key) if isinstance(target, dict) else None
        if not isinstance(target, dict):
            raise ConfigurationError(f"the JSON Schema's $ref {ref!r} points at nothing")
        return self.follow(target, depth + 1)

    def kind(self, node: dict[str, Any]) -> str | None:
        kind = node.get("type")
        if isinstance(kind, list):
            rest = [k for k in kind if k != "null"]
            return rest[0] if len(rest) == 1 else None
        if kind is None and "properties" in node:
            return "object"
        return kind

    def spark_type(self, node: Any, depth: int = 0) -> str:
        if depth > 32:
            raise ConfigurationError("the JSON Schema nests deeper than 32 levels (a recursive $ref?): Spark types "
                                     "cannot recurse; read the value as string")
        if not isinstance(node, dict):
            return "STRING"
        node = self.follow(node)
        kind = self.kind(node)
        if kind in SCALARS:
            return SCALARS[kind]
        if kind == "array":
            return f"ARRAY<{self.spark_type(node.get('items', {}), depth + 1)}>"
        if kind == "object":
            properties = node.get("properties")
            if properties:
                return f"STRUCT<{self.fields(properties, depth + 1, ': ')}>"
            extra = node.get("additionalProperties")
            return f"MAP<STRING, {self.spark_type(extra if isinstance(extra, dict) else {}, depth + 1)}>"
        return "STRING"  # oneOf / anyOf / several types: the JSON text

    def fields(self, properties: dict[str, Any], depth: int, separator: str = " ") -> str:
        return ", ".join(f"{_quoted(name)}{separator}{self.spark_type(spec, depth)}"
                         for name, spec in properties.items())


def spark_ddl(schema: str | dict[str, Any]) -> str:
    """The columns ('`id` BIGINT, `name` STRING') of an object JSON Schema."""
    root = json.loads(schema) if isinstance(schema, str) else schema
    converter = _Converter(root)
    top = converter.follow(root)
    if converter.kind(top) != "object" or not top.get("properties"):
        raise ConfigurationError("the value's JSON Schema is not an object with properties: the transform gets one "
                                 "column per property; read the value as value_format='bytes' instead")
    return converter.fields(top["properties"], 1)


def required_fields(schema: str | dict[str, Any]) -> list[str]:
    """The top-level properties a record must have with a value (required, and null not allowed)."""
    root = json.loads(schema) if isinstance(schema, str) else schema
    converter = _Converter(root)
    top = converter.follow(root)
    found = []
    for name in top.get("required", ()):
        spec = top.get("properties", {}).get(name)
        spec = converter.follow(spec) if isinstance(spec, dict) else {}
        kind = spec.get("type")
        if not (kind == "null" or (isinstance(kind, list) and "null" in kind)):
            found.append(name)
    return found


def spark_type(schema: str | dict[str, Any]) -> str:
    """The Spark type of any JSON Schema (a key's: often a bare string or number)."""
    root = json.loads(schema) if isinstance(schema, str) else schema
    return _Converter(root).spark_type(root)
