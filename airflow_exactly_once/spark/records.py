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

from typing import Any, Callable

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.records.avro_schema import all_null_encoding, record_fields
from airflow_exactly_once.records.bad_records import DEAD_LETTER_COLUMNS

SOURCE = "_source"
BAD_RECORD = "_bad_record"
DECODE_ERROR = "_aeo_decode_error"
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")
INTERNAL = (SOURCE, BAD_RECORD, DECODE_ERROR)


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

    return frame.withColumn(SOURCE, F.struct(*(F.col(c) for c in ("topic", "partition", "offset", "timestamp",
                                                                    "key", "value"))))


def checks_decoding(config: PipelineConfig) -> bool:
    """Whether `decode` adds DECODE_ERROR: json and avro values can fail to decode, the others cannot."""
    return config.value_format not in (None, "bytes", "string")


def decode(frame: Any, config: PipelineConfig) -> Any:
    """The value decoded per `value_format`; json and avro add DECODE_ERROR (null when the record decoded)."""
    from pyspark.sql import functions as F

    fmt = config.value_format
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
    else:  # avro
        from pyspark.sql.avro.functions import from_avro

        parsed = from_avro(F.col("value"), config.value_schema, {"mode": "PERMISSIVE"})
        # PERMISSIVE gives a record of nulls for a value it cannot decode (records.avro_schema)
        all_null = F.lit(True)
        for name in (f["name"] for f in record_fields(config.value_schema)):
            all_null = all_null & F.col(f"_aeo_parsed.{name}").isNull()
        real_all_null = all_null_encoding(config.value_schema)
        undecoded = all_null if real_all_null is None else all_null & (F.col("value") != F.lit(real_all_null))
        # Bytes after a complete record are not part of it: re-encoding what was read gives the value back.
        from pyspark.sql.avro.functions import to_avro

        trailing = F.length(to_avro(F.col("_aeo_parsed"), config.value_schema)) != F.length(F.col("value"))
        error = F.when(F.col("value").isNull(), F.lit("a null value (a tombstone)")).when(
            F.col("_aeo_parsed").isNull() | undecoded,
            F.lit("not an Avro record of value_schema (malformed or truncated)")).when(
            trailing, F.lit("not one Avro record of value_schema: bytes follow the record"))
    decoded = frame.withColumn("_aeo_parsed", parsed).withColumn(DECODE_ERROR, error)
    fields = [f.name for f in decoded.schema["_aeo_parsed"].dataType.fields if f.name != DECODE_ERROR]
    kept = [c for c in frame.columns if c not in fields]  # a decoded field named like a Kafka column wins
    return decoded.select(*(F.col(f"_aeo_parsed.{f}").alias(f) for f in fields), *kept, DECODE_ERROR)


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
