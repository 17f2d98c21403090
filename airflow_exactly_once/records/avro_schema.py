"""What the Avro record schema of value_format="avro" tells before Spark decodes anything, and the end mark.

Spark's `from_avro` neither says when a value is longer than the record it decoded nor, in
PERMISSIVE mode, tells a value it cannot decode from a record of nulls. Both are answered in the
same single decode (spark.records): the data gets END_MARK's encoding appended and is read with
the schema `end_marked(schema)`, the record followed by one Avro long. That long reads back as
END_MARK only when the record ended exactly where the data did: a cut record eats into the mark,
bytes after the record are read in its place, and undecodable data leaves it null. A
re-encoding of each record (`to_avro`) would tell the same for about a quarter of the read's time.
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


# A long whose zigzag varint takes Avro's longest, 10 bytes: a read that starts inside it (a cut record ate
# into it) ends with fewer bytes, a smaller number; one that starts in bytes before it and runs into it goes
# past 10 bytes, which Avro refuses. Only bytes after the record that encode exactly this long pass for it.
END_MARK = -0x6A3F52C19B07E4D5
END_MARK_BYTES = zigzag_varint(END_MARK)
END_MARKED_NAME = "aeo_end_marked"  # no namespace: the record's own names resolve as without the wrapper


def end_marked(schema: str) -> str:
    """`schema` (Avro JSON) as the field `record` of a record whose field `end` (a long) follows it."""
    return json.dumps({"type": "record", "name": END_MARKED_NAME,
                       "fields": [{"name": "record", "type": json.loads(schema)}, {"name": "end", "type": "long"}]})
