"""What the Avro record schema of value_format="avro" tells before Spark decodes anything.

Spark's `from_avro` in PERMISSIVE mode returns a record of nulls, not a null, for a value it
cannot decode. A record of nulls is a real record only when every field may be null, and then
its Avro encoding is one fixed byte string (each field's union branch of "null"). So a decoded
record of nulls is bad unless its value is exactly that encoding (spark.records uses this).
"""

from __future__ import annotations

import json
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.records.wire_format import zigzag_varint


def record_fields(schema: str) -> list[dict[str, Any]]:
    """The fields of an Avro record schema given as JSON, or a ConfigurationError saying what is wrong."""
    try:
        parsed = json.loads(schema)
    except ValueError as exc:
        raise ConfigurationError(f"value_schema is not an Avro schema in JSON ({exc}); give the record schema, "
                                 "e.g. '{\"type\": \"record\", \"name\": \"Order\", \"fields\": [{\"name\": \"id\", "
                                 "\"type\": \"long\"}]}'") from exc
    if not isinstance(parsed, dict) or parsed.get("type") != "record" or not isinstance(parsed.get("fields"), list) \
            or not parsed["fields"]:
        raise ConfigurationError("value_format='avro' needs value_schema to be an Avro record schema with fields "
                                 "(the transform gets one column per field)")
    return parsed["fields"]


def all_null_encoding(schema: str) -> bytes | None:
    """The Avro encoding of the record whose fields are all null, or None when some field cannot be null."""
    encoded = b""
    for field in record_fields(schema):
        kind = field.get("type")
        if kind == "null":
            continue  # a null is encoded as nothing
        if isinstance(kind, list) and "null" in kind:
            encoded += zigzag_varint(kind.index("null"))  # the union's branch
            continue
        return None
    return encoded
