"""Which writer -> reader schema resolutions spark.records makes as a projection of the writer's fields."""

from __future__ import annotations

import json

from airflow_exactly_once.records.avro_projection import FieldSource, projection

BASE = {"type": "record", "name": "Order", "namespace": "shop",
        "fields": [{"name": "id", "type": "int"}, {"name": "item", "type": "string"},
                   {"name": "tags", "type": {"type": "array", "items": "string"}}]}


def schema(*fields, **attributes) -> str:
    return json.dumps({**BASE, **attributes, "fields": list(fields)})


def test_added_removed_and_promoted_fields_are_a_projection_in_the_readers_order():
    writer = json.dumps(BASE)
    reader = schema({"name": "note", "type": ["null", "string"], "default": None},
                    {"name": "id", "type": "long"}, {"name": "tags", "type": {"type": "array", "items": "string"}},
                    {"name": "qty", "type": "int", "default": 1})
    assert projection(writer, reader) == [FieldSource("note", None, "string", None), FieldSource("id", "id", "bigint"),
                                          FieldSource("tags", "tags"), FieldSource("qty", None, "int", 1)]


def test_what_only_avros_resolution_does_is_left_to_it():
    writer = json.dumps(BASE)
    assert projection(writer, schema({"name": "ident", "type": "int", "aliases": ["id"]})) is None  # an alias
    assert projection(writer, schema({"name": "tags", "type": {"type": "array", "items": "bytes"}})) is None
    assert projection(writer, schema({"name": "id", "type": ["null", "long"]})) is None  # into a union
    assert projection(writer, schema({"name": "blob", "type": "bytes", "default": "\u00ff"})) is None
    assert projection(writer, schema({"name": "when", "type": {"type": "long", "logicalType": "timestamp-millis"},
                                      "default": 0})) is None
    assert projection(writer, schema(*BASE["fields"], name="Other")) is None
    assert projection(writer, schema(*BASE["fields"], namespace="other")) is None
    named = {"name": "where", "type": "shop.Address"}  # a named type defined elsewhere may differ
    assert projection(schema(named), schema(named)) is None
    assert projection('"string"', '"string"') is None
