"""Avro in the wire format on a real Spark: records of writer schemas that differ from the reader's (fields added
with defaults, dropped, promoted, a promotion inside an array) and of the reader's own schema decode to the same
reader record in one batch; a cut or lengthened record of either is bad."""

from __future__ import annotations

import io
import json

import fastavro

from airflow_exactly_once.records.registry import PartSchemas
from airflow_exactly_once.records.wire_format import frame
from tests.harness import pipeline_config

READER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "note", "type": ["null", "string"], "default": None},
    {"name": "sizes", "type": {"type": "array", "items": "long"}}, {"name": "qty", "type": "int", "default": 7}]}
PROJECTED = {**READER, "fields": [{"name": "id", "type": "int"}, {"name": "dropped", "type": "string"},
                                  {"name": "sizes", "type": {"type": "array", "items": "long"}}]}
RESOLVED = {**READER, "fields": [{"name": "id", "type": "long"},
                                 {"name": "sizes", "type": {"type": "array", "items": "int"}}]}  # int -> long inside


def encode(schema: dict, record: dict) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return body.getvalue()


def test_evolved_and_own_writers_decode_alike_and_cut_records_are_bad(spark):
    from airflow_exactly_once.spark import records

    values = [
        frame(1, encode(PROJECTED, {"id": 1, "dropped": "x", "sizes": [1, 2]})),
        frame(2, encode(RESOLVED, {"id": 2, "sizes": [3]})),
        frame(3, encode(READER, {"id": 3, "note": "n", "sizes": [], "qty": 4})),
        frame(1, encode(PROJECTED, {"id": 4, "dropped": "y", "sizes": [5]})[:-2]),
        frame(2, encode(RESOLVED, {"id": 5, "sizes": [6]}) + b"\x00"),
    ]
    schemas = {"value": PartSchemas("value", "avro", json.dumps(READER), "test",
                                    {1: json.dumps(PROJECTED), 2: json.dumps(RESOLVED), 3: json.dumps(READER)})}
    config = pipeline_config("writers", ["t"], {"type": "parquet", "path": "/tmp/unused"})
    decoded = records.decode(spark.createDataFrame([(v,) for v in values], "value BINARY"), config, schemas)
    assert [f.name for f in decoded.schema.fields][:4] == ["id", "note", "sizes", "qty"]
    got = [(r["id"], r["note"], r["sizes"], r["qty"], r[records.DECODE_ERROR]) for r in decoded.collect()]
    assert got[:3] == [(1, None, [1, 2], 7, None), (2, None, [3], 7, None), (3, "n", [], 4, None)]
    assert "truncated or corrupt Avro data of schema id 1" in got[3][4]
    assert "schema id 2: the record does not end where the data does" in got[4][4]
