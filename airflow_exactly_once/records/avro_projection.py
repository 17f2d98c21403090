"""Avro schema resolution that is only a projection of the writer's top-level fields.

Spark's `from_avro` with a reader schema (`avroSchema`) resolves every record through Avro's
resolving decoder: measured at more than twice the time of decoding the same records with their
own schema. Most schema evolution is top-level field work, though: a field added with a default,
a field removed, a number promoted (int to long). For such a writer the records are decoded with
their writer schema and the reader's record is built from the decoded fields by a few cheap column
expressions (spark.records). Anything else (nested records that changed, unions, enums, aliases,
logical types in a changed field) is left to Avro's resolution.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from airflow_exactly_once.records.avro_resolution import PRIMITIVES, PROMOTIONS

# Spark's types for Avro's primitives, as from_avro gives them (for a promotion's cast and a default's type).
SPARK_TYPES = {"boolean": "boolean", "int": "int", "long": "bigint", "float": "float", "double": "double",
               "bytes": "binary", "string": "string"}


@dataclass(frozen=True)
class FieldSource:
    """Where one field of the reader's record comes from: the writer's field `writer_field` (cast to `spark_type`
    when that is set: a promotion), or, with no writer field, the literal `default` of `spark_type`."""

    name: str
    writer_field: str | None
    spark_type: str | None = None
    default: Any = None


def projection(writer: str, reader: str) -> list[FieldSource] | None:
    """How the reader's record is made from a record decoded with the writer schema (a resolvable pair, see
    records.avro_resolution), in the reader's field order; None when Avro's own resolution is needed."""
    w, r = json.loads(writer), json.loads(reader)
    if not (_is_record(w) and _is_record(r)) or w.get("name") != r.get("name") or \
            w.get("namespace") != r.get("namespace"):
        return None
    written = {f["name"]: f for f in w["fields"]}
    sources = []
    for field in r["fields"]:
        if field.get("aliases"):
            return None
        source = written.get(field["name"])
        if source is None:
            made = _default(field)
        elif source["type"] == field["type"] and _self_contained(field["type"]):
            made = FieldSource(field["name"], field["name"])
        elif isinstance(source["type"], str) and isinstance(field["type"], str) and \
                field["type"] in PROMOTIONS.get(source["type"], ()):
            made = FieldSource(field["name"], field["name"], SPARK_TYPES[field["type"]])
        else:
            made = None
        if made is None:
            return None
        sources.append(made)
    return sources


def _is_record(node: Any) -> bool:
    return isinstance(node, dict) and node.get("type") == "record" and isinstance(node.get("fields"), list)


def _default(field: dict[str, Any]) -> FieldSource | None:
    """A reader field the writer lacks: its default as a literal, for a primitive or a nullable primitive."""
    if "default" not in field:
        return None
    kind, default = field["type"], field["default"]
    if isinstance(kind, list) and len(kind) == 2 and kind[0] == "null" and default is None:
        kind = kind[1]  # a nullable primitive whose default is null
    elif default is None or kind == "bytes":  # bytes defaults are code points
        return None
    if not isinstance(kind, str) or kind not in SPARK_TYPES:  # a logical type, a union, a complex type
        return None
    return FieldSource(field["name"], None, SPARK_TYPES[kind], default)


def _self_contained(node: Any) -> bool:
    """Whether a field's type means the same in any schema: no reference to a named type defined elsewhere."""
    if isinstance(node, str):
        return node in PRIMITIVES
    if isinstance(node, list):
        return all(_self_contained(branch) for branch in node)
    if isinstance(node, dict):
        kind = node.get("type")
        if kind in ("record", "error"):
            return all(_self_contained(f.get("type")) for f in node.get("fields", ()))
        if kind == "array":
            return _self_contained(node.get("items"))
        if kind == "map":
            return _self_contained(node.get("values"))
        if kind in ("enum", "fixed"):
            return True
        return _self_contained(kind)
    return False
