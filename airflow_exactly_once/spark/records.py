"""Decoding Kafka values, and telling good records from bad ones, in the write's Spark job.

What the transform receives: with `value_format` set, the decoded value's fields as columns,
next to Kafka's own (`key`, `value` raw, `topic`, `partition`, `offset`, `timestamp`); always,
a struct column `_source` with where the record came from. A record is bad when its value
does not decode under `value_schema` (strict: a malformed value is never a row of nulls, and
content after a complete JSON value or Avro record makes it bad too) or
when the transform marks it: a non-null string in the column `_bad_record` (`mark_bad`), for
example from a function that raised on that record (`guarded_column`). A transform that marks
records keeps `_source` in its output (`select("*", ...)` does). The sink never receives
`_source` or `_bad_record`.

    from airflow_exactly_once.spark.records import guarded_column, mark_bad

    def transform(df):
        df = guarded_column(df, "share", lambda amount: 100 // amount, "long", "amount")  # 0 raises: bad
        df = mark_bad(df, "amount < 0", "a negative amount")
        return df.select("id", "share", "_source", "_bad_record")
"""

from __future__ import annotations

import json
from typing import Any, Callable

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.records.avro_schema import END_MARK, END_MARK_BYTES, end_marked
from airflow_exactly_once.records import protobuf_rows
from airflow_exactly_once.records.bad_records import DEAD_LETTER_COLUMNS
from airflow_exactly_once.records.json_schema import required_fields, spark_ddl, spark_type
from airflow_exactly_once.records.registry import PartSchemas
from airflow_exactly_once.records.wire_format import HEADER
from airflow_exactly_once.records.wire_format import frame as wire_frame

__all__ = ["mark_bad", "guarded_column"]

SOURCE = "_source"
BAD_RECORD = "_bad_record"
DECODE_ERROR = "_aeo_decode_error"
UNKNOWN_ID = "unknown schema id "  # the start of the reason of a record whose id no subject version had
# The columns of Spark's Kafka source (without headers) and their Spark SQL types; a small batch's local relation
# (job.local_frame, from kafka.range_read's rows in this order) has them too.
KAFKA_SOURCE_COLUMNS = (("key", "BINARY"), ("value", "BINARY"), ("topic", "STRING"), ("partition", "INT"),
                        ("offset", "BIGINT"), ("timestamp", "TIMESTAMP"), ("timestampType", "INT"))
KAFKA_COLUMNS = tuple(name for name, _ in KAFKA_SOURCE_COLUMNS)
INTERNAL = (SOURCE, BAD_RECORD, DECODE_ERROR)
BAD_RECORD_FOUND = "airflow-exactly-once found a bad record in the one-pass write: "  # see failing_at_bad_record


def mark_bad(df: Any, condition: Any, reason: Any) -> Any:
    """Mark the rows where `condition` (a Column or SQL text) holds as bad records; `reason` (text or a Column)
    is their error. A row already marked keeps its first reason."""
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    test = F.expr(condition) if isinstance(condition, str) else condition
    mark = F.when(test, reason if isinstance(reason, Column) else F.lit(str(reason)))
    if BAD_RECORD in df.columns:
        mark = F.coalesce(F.col(BAD_RECORD), mark)
    return df.withColumn(BAD_RECORD, mark)


def guarded_column(df: Any, name: str, function: Callable[..., Any], return_type: Any, *columns: Any) -> Any:
    """df with column `name` = `function(*columns)` as a Python UDF whose exceptions mark that record bad
    (with the exception as its error) instead of failing the batch, as a plain UDF that raises would."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType, _parse_datatype_string

    result_type = _parse_datatype_string(return_type) if isinstance(return_type, str) else return_type
    schema = StructType([StructField("result", result_type), StructField("error", StringType())])

    def guarded(*args: Any) -> tuple[Any, str | None]:
        try:
            return function(*args), None
        except Exception as exc:  # the point: one record's failure is that record's error
            return None, f"{type(exc).__name__}: {exc}"[:1000]

    tmp = f"_aeo_guarded_{name}"
    df = df.withColumn(tmp, F.udf(guarded, schema)(*columns))
    df = mark_bad(df, F.col(f"{tmp}.error").isNotNull(), F.col(f"{tmp}.error"))
    return df.withColumn(name, F.col(f"{tmp}.result")).drop(tmp)


def with_source(frame: Any) -> Any:
    """Kafka's rows plus `_source`: where each record came from, kept for its dead letter."""
    from pyspark.sql import functions as F

    fields = ", ".join(f"'{c}', `{c}`" for c in ("topic", "partition", "offset", "timestamp", "key", "value"))
    return frame.withColumn(SOURCE, F.expr(f"named_struct({fields})"))


def checks_decoding(config: PipelineConfig) -> bool:
    """Whether `decode` adds DECODE_ERROR: json, avro and the registry formats can fail to decode."""
    return config.value_format not in (None, "bytes", "string") or config.uses_registry("key")


def decode(frame: Any, config: PipelineConfig, schemas: dict[str, PartSchemas] | None = None) -> Any:
    """The value (and key) decoded per `value_format` (`key_format`); formats that can fail add DECODE_ERROR
    (null when the record decoded). `schemas`: the registry formats' schemas per part (records.registry)."""
    from pyspark.sql import functions as F

    schemas = schemas or {}
    if config.key_format == "string":
        frame = frame.withColumn("key", F.col("key").cast("string"))
    if "key" in schemas:
        frame = _decode_registry(frame, schemas["key"], into="key")
    fmt = config.value_format
    if "value" in schemas:
        return _decode_registry(frame, schemas["value"], into=None)
    if fmt is None or fmt == "bytes":
        return frame
    if fmt == "string":
        return frame.withColumn("value", F.col("value").cast("string"))
    if fmt == "json":
        schema = f"{config.value_schema}, {DECODE_ERROR} STRING"
        parsed = F.from_json(F.col("value").cast("string"), schema,
                             {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": DECODE_ERROR})
        reason = "not JSON matching value_schema (malformed, or a field of another type)"
        error = F.when(F.col("value").isNull(), F.lit("a null value (a tombstone)")).when(
            F.col("_aeo_parsed").isNull() | F.col(f"_aeo_parsed.{DECODE_ERROR}").isNotNull(), F.lit(reason)).when(
            ~_one_json_value(F.col("value").cast("string")),
            F.lit("not one JSON value: content follows the value (Spark's reader would stop before it)"))
    else:  # avro: one decode tells a good record, undecodable data and a record that is not the whole value
        from pyspark.sql.avro.functions import from_avro

        parsed = from_avro(F.concat(F.col("value"), F.lit(END_MARK_BYTES)), end_marked(config.value_schema),
                           {"mode": "PERMISSIVE"})
        end = F.col("_aeo_parsed.end")
        error = F.when(F.col("value").isNull(), F.lit("a null value (a tombstone)")).when(
            end.isNull(), F.lit("not an Avro record of value_schema (malformed or truncated)")).when(
            end != F.lit(END_MARK), F.lit("not an Avro record of value_schema: the record does not end where the "
                                          "value does (truncated, or bytes following the record)"))
    if DECODE_ERROR in frame.columns:  # the key's error comes first
        error = F.coalesce(F.col(DECODE_ERROR), error)
    return _spread_record(frame.withColumn("_aeo_parsed", parsed), "_aeo_parsed", fmt, error, frame.columns, None)


def _decode_registry(frame: Any, schemas: PartSchemas, into: str | None) -> Any:
    """One part (value or key) read in the Schema Registry wire format: the magic byte, the writer schema's id,
    then the data, decoded to the reader schema (`_avro_payload`, `_json_payload`). A value not in the wire
    format, an unknown id, a writer schema that does not resolve, or data that is truncated or corrupt gives the
    record its DECODE_ERROR. `into`: the column that takes the decoded part (the key), or None to spread a
    record's fields as columns (the value).

    The expressions are SQL text where Spark has the function: each Column built in Python is a round trip to
    the JVM, and the Column API's version of this took hundreds of them per batch (docs/benchmarks.md)."""
    from pyspark.sql import functions as F

    part = f"`{schemas.part}`"
    label = "" if schemas.part == "value" else "key: "
    ids = _SchemaIds(part)
    payload = F.expr(f"substring({part}, {HEADER + 1})")
    temp = f"_aeo_parsed_{schemas.part}"
    decoder = {"avro": _avro_payload, "json_schema": _json_payload, "protobuf": _protobuf_payload}[schemas.fmt]
    parsed, problem = decoder(schemas, payload, ids, temp)
    reasons = [(f"{part} IS NULL", _sql_text(f"{label}a null {schemas.part} (a tombstone)")),
               (f"NOT (length({part}) >= {HEADER} AND substring({part}, 1, 1) = X'00')",
                _sql_text(f"{label}not in the Schema Registry wire format (no magic byte 0 and 4-byte schema id)"))]
    reasons += [(ids.of(writer_id), _sql_text(label + reason))
                for writer_id, reason in sorted(schemas.unresolvable.items())]
    reasons.append((f"NOT ({ids.among(sorted(schemas.writers))})",
                    f"concat({_sql_text(label + UNKNOWN_ID)}, {ids.number()}, ' (the registry does not know it)')"))
    error = F.coalesce(F.expr("CASE " + " ".join(f"WHEN {test} THEN {reason}" for test, reason in reasons) + " END"),
                       F.concat(F.lit(label), problem))
    if schemas.fmt == "avro":  # a record read up to its end mark is whole: the other checks only for the rest
        error = F.when(F.expr(f"`{temp}`.end IS NULL OR `{temp}`.end != {END_MARK}"), error)
    if DECODE_ERROR in frame.columns:  # the key's error comes first
        error = F.coalesce(F.col(DECODE_ERROR), error)
    return _spread_record(frame.withColumn(temp, parsed), temp, schemas.fmt, error, frame.columns, into)


def _spread_record(decoded: Any, temp: str, fmt: str, error: Any, columns: list[str], into: str | None) -> Any:
    """One projection: the record decoded into `temp` (without Avro's end mark or our error field) as columns
    beside Kafka's (a decoded field named like a Kafka column wins), or as the column `into`; and DECODE_ERROR."""
    from pyspark.sql import functions as F

    record, record_type = f"`{temp}`", decoded.schema[temp].dataType
    if fmt == "avro":
        record, record_type = f"`{temp}`.record", record_type["record"].dataType
    fields = [f.name for f in getattr(record_type, "fields", [])]  # none when a key is not a record
    names = [name for name in fields if name != DECODE_ERROR]
    if into is not None:
        value = F.expr(record)
        if DECODE_ERROR in fields:
            value = value.dropFields(DECODE_ERROR)  # the error field is ours, not the transform's
        kept = [F.col(f"`{c}`") for c in columns if c not in (into, DECODE_ERROR)]
        return decoded.select(*kept, value.alias(into), error.alias(DECODE_ERROR))
    kept = [F.col(f"`{c}`") for c in columns if c not in names and c != DECODE_ERROR]
    return decoded.select(*(F.expr(f"{record}.`{name}`").alias(name) for name in names), *kept,
                          error.alias(DECODE_ERROR))


class _SchemaIds:
    """The writer schema id of a part in the wire format, as SQL. Records are told apart by their 5-byte header
    compared as bytes with each known id's; the id as a number (a hex string parsed per record, a sixth of a
    1M-record decode's time) is made only where a bad record's reason names it."""

    def __init__(self, column: str) -> None:
        self.column = column
        self.header = f"substring({column}, 1, {HEADER})"

    def of(self, writer_id: int) -> str:
        """Whether the record was written with schema `writer_id`."""
        return f"{self.header} = {_sql_bytes(wire_frame(writer_id, b''))}"

    def among(self, writer_ids: list[int]) -> str:
        """Whether the record was written with one of `writer_ids` (false for none)."""
        if not writer_ids:
            return "false"
        return f"{self.header} IN ({', '.join(_sql_bytes(wire_frame(i, b'')) for i in writer_ids)})"

    def number(self) -> str:
        """The id, as a string for a reason."""
        return f"conv(hex(substring({self.column}, 2, 4)), 16, 10)"


def _sql_text(text: str) -> str:
    """`text` as a SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _sql_bytes(data: bytes) -> str:
    """`data` as a SQL binary literal."""
    return f"X'{data.hex()}'"


def _avro_payload(schemas: PartSchemas, payload: Any, ids: _SchemaIds, result: str) -> tuple[Any, Any]:
    """Avro data decoded with its writer schema and resolved to the reader's (from_avro with `avroSchema`, one
    branch per writer id: CASE evaluates only the branch of a record's id), the end mark after it
    (records.avro_schema); and the problem of a record whose decoded column `result` shows the data was truncated
    or corrupt, or had bytes after the record (null when it decoded)."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    marked = F.concat(payload, F.lit(END_MARK_BYTES))
    reader = end_marked(schemas.reader)
    parsed = None
    for writer_id, writer in sorted(schemas.writers.items()):
        options = {"mode": "PERMISSIVE"}
        if _canonical_json(writer) != _canonical_json(schemas.reader):
            options["avroSchema"] = reader
        branch = from_avro(marked, end_marked(writer), options)
        is_writer = F.expr(ids.of(writer_id))
        parsed = F.when(is_writer, branch) if parsed is None else parsed.when(is_writer, branch)
    if parsed is None:  # no writer schema resolves: a null of the reader's type
        parsed = from_avro(F.lit(None).cast("binary"), reader, {"mode": "PERMISSIVE"})
    end, corrupt = f"`{result}`.end", f"concat('truncated or corrupt Avro data of schema id ', {ids.number()}"
    return parsed, F.expr(f"CASE WHEN {end} IS NULL THEN {corrupt}) WHEN {end} != {END_MARK} THEN {corrupt}, "
                          "': the record does not end where the data does (truncated, or bytes following the "
                          "record)') END")


def _json_payload(schemas: PartSchemas, payload: Any, ids: _SchemaIds, result: str) -> tuple[Any, Any]:
    """JSON text read with the reader JSON Schema's Spark type (records.json_schema), as strictly as
    value_format="json": malformed JSON, a property of another type, content after the value, or a required
    property missing make the record bad (`result`: the column the parsed value goes into)."""
    from pyspark.sql import functions as F

    decoded = F.col(result)
    text = payload.cast("string")
    ddl = spark_ddl(schemas.reader) if schemas.part == "value" else None
    schema = f"{ddl}, {DECODE_ERROR} STRING" if ddl else spark_type(schemas.reader)
    if ddl is None:  # a key: one JSON value of any type
        parsed = F.from_json(F.concat(F.lit('{"k":'), text, F.lit("}")), f"k {schema}")["k"]
        return parsed, F.when(~_one_json_value(text) | (decoded.isNull() & (F.trim(text) != F.lit("null"))),
                              F.lit("not one JSON value matching the key's JSON Schema"))
    parsed = F.from_json(text, schema, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": DECODE_ERROR})
    problem = F.when(decoded.isNull() | decoded[DECODE_ERROR].isNotNull(),
                     F.lit("not JSON matching the reader's JSON Schema (malformed, or a property of another type)"))
    problem = problem.when(~_one_json_value(text), F.lit("not one JSON value: content follows the value"))
    for name in required_fields(schemas.reader):
        problem = problem.when(decoded[name].isNull(), F.lit(f"the required property {name!r} is missing or null"))
    return parsed, problem


def _protobuf_payload(schemas: PartSchemas, payload: Any, ids: _SchemaIds, result: str) -> tuple[Any, Any]:
    """Protobuf data (message indexes, then the message) decoded with the reader's message for every known writer
    id (Protobuf evolves by field numbers: fields the reader lacks are skipped), by the protobuf runtime in a
    Python UDF (records.protobuf_rows: Spark's from_protobuf is not to be had from the package index). Message
    indexes naming another message, and truncated or corrupt data, are the record's problem."""
    from pyspark.sql import functions as F

    message = schemas.protobuf
    if message is None:
        raise ConfigurationError(f"the {schemas.part}'s Protobuf reader schema ({schemas.reader_ref}) was not "
                                 "compiled (records.registry.part_schemas compiles it)")
    ddl = protobuf_rows.spark_ddl(message)
    decoder = F.udf(lambda data: protobuf_rows.decode(message, data, DECODE_ERROR),
                    f"{ddl}, {DECODE_ERROR} STRING" if ddl else f"{DECODE_ERROR} STRING")
    known = sorted(schemas.writers)
    parsed = F.when(F.expr(ids.among(known)), decoder(payload))  # else: _decode_registry
    return parsed, F.col(result)[DECODE_ERROR]


def _canonical_json(text: str) -> str:
    return json.dumps(json.loads(text), sort_keys=True)


def unknown_ids(decoded: Any, part: str) -> list[int]:
    """The schema ids that records of a decoded batch name in `part` but the registry's subjects did not hold."""
    from pyspark.sql import functions as F

    prefix = ("" if part == "value" else "key: ") + UNKNOWN_ID
    rows = decoded.filter(F.col(DECODE_ERROR).startswith(prefix)).select(
        F.regexp_extract(F.col(DECODE_ERROR), prefix + r"(\d+)", 1).alias("id")).distinct().limit(100).collect()
    return [int(row["id"]) for row in rows if row["id"]]


def _one_json_value(text: Any) -> Any:
    """Whether `text` is one JSON value and nothing after it (whitespace aside).

    Spark's JSON reader parses the first value and ignores what follows (`{"id": 1} garbage` reads
    as {"id": 1}). Inside an array, content after the value is an error, and so it is inside an
    object; a value that closes one of the two early (`{...}] x`) still breaks the other.
    """
    from pyspark.sql import functions as F

    in_array = F.from_json(F.concat(F.lit("["), text, F.lit("]")), "ARRAY<STRING>")
    in_object = F.from_json(F.concat(F.lit('{"v":'), text, F.lit("}")), "v STRING, _aeo_rest STRING",
                            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_aeo_rest"})
    return F.coalesce(F.size(in_array) == 1, F.lit(False)) & in_object["_aeo_rest"].isNull()


def failing_at_bad_record(decoded: Any) -> Any:
    """`decoded`'s good records without DECODE_ERROR; the Spark task that meets a bad one fails (raise_error, its
    message starting with BAD_RECORD_FOUND): the one-pass write of a batch that turns out to have bad records
    stops there and takes the policy path, and a batch without any is written with nothing counted on the way.

    The error column is made non-deterministic (a test of the task's partition id that always holds): Spark
    does not push a filter below a projection with such a column, so the check stays above the decode instead
    of decoding every record twice (once for the filter, once for the columns), and no Observation, which
    stops Spark's code generation, has to stand between them."""
    from pyspark.sql import functions as F

    barrier = F.expr(f"CASE WHEN spark_partition_id() >= 0 THEN {DECODE_ERROR} END")
    found = _sql_text(BAD_RECORD_FOUND)
    return decoded.withColumn(DECODE_ERROR, barrier).filter(
        F.expr(f"{DECODE_ERROR} IS NULL OR raise_error(concat({found}, {DECODE_ERROR})) IS NULL")).drop(DECODE_ERROR)


def found_bad_record(exc: BaseException) -> bool:
    """Whether `exc` (or what it was raised from) is a task of `failing_at_bad_record` meeting a bad record."""
    seen: BaseException | None = exc
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:  # a chain can loop back on itself
        if BAD_RECORD_FOUND in str(seen):
            return True
        visited.add(id(seen))
        seen = seen.__cause__ or seen.__context__
    return False


def dead_letters(frame: Any, error: str, batch_id: str, pipeline_id: str) -> Any:
    """Rows of `frame` as dead-letter records (DEAD_LETTER_COLUMNS), from their `_source` and the `error` column."""
    from pyspark.sql import functions as F

    source = F.col(SOURCE)
    columns = {
        "pipeline_id": F.lit(pipeline_id), "batch_id": F.lit(batch_id),
        "source_topic": source["topic"], "source_partition": source["partition"],
        "source_offset": source["offset"], "source_timestamp": source["timestamp"],
        "key": source["key"], "value": source["value"], "error": F.col(error),
    }
    return frame.select(*(columns[name].alias(name) for name in DEAD_LETTER_COLUMNS))


def without_internal(frame: Any) -> Any:
    """What the sink receives: the transform's output without our own columns."""
    return frame.drop(*[c for c in INTERNAL if c in frame.columns])
