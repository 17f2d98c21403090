"""The Kafka sink's records in the Schema Registry wire format (value_format / key_format in its spec).

Each part (value, key) gets a writer schema, given or derived from the output's Spark type
(records.schema_from_spark), and that schema's id under its subject (TopicNameStrategy:
`<topic>-value`; RecordNameStrategy: the record's full name). The id is looked up, never
registered unless `register_schemas` is on; a schema the subject lacks or refuses fails with
the registry's reason before anything is written: at plan time for a given schema (check),
before the first record for a derived one. Spark encodes Avro and JSON (`to_avro` / `to_json`)
and the 5-byte header is prepended in the same expression: nothing per record happens in Python.
Protobuf is the exception: Spark's `to_protobuf` is not to be had (records.protobuf_encode), so a
Python UDF serializes each row with the protobuf runtime from the descriptor set compiled here
on the driver; Spark prepends the header and the message indexes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.records import protobuf_encode
from airflow_exactly_once.records.protobuf_rows import ProtobufMessage
from airflow_exactly_once.records.registry import Registry, protobuf_reader
from airflow_exactly_once.records.schema_from_spark import avro_name, avro_schema, json_schema, proto_schema
from airflow_exactly_once.records.wire_format import SCHEMA_TYPES, message_indexes

PARTS = ("value", "key")
WRITE_FORMATS = ("avro", "json_schema", "protobuf")


@dataclass
class PartWriter:
    """How one part of the sink's records is written: format, schema (None: derived) and subject."""

    part: str
    fmt: str
    topic: str
    schema: str | None
    strategy: str
    record_name: str | None
    register: bool

    def derived_schema(self, spark_type: Any) -> str:
        type_json = spark_type.jsonValue() if hasattr(spark_type, "jsonValue") else spark_type
        if self.fmt == "avro":
            full = self.record_name or avro_name(f"{self.topic}_{self.part}")
            namespace, _, name = full.rpartition(".")
            return json.dumps(avro_schema(type_json, name, namespace or None))
        if self.fmt == "protobuf":
            full = self.record_name or avro_name(f"{self.topic}_{self.part}")
            package, _, name = full.rpartition(".")
            return proto_schema(type_json, name, package or None)
        return json.dumps(json_schema(type_json, self.record_name))

    def message(self, schema: str) -> ProtobufMessage:
        """Protobuf: the .proto compiled on the driver (cached per text), and the message written: the file's
        first, or record_name's for a given schema."""
        named = self.record_name if self.schema is not None else None
        return protobuf_reader(schema, {}, f"the kafka sink's {self.part} schema", named)

    def subject(self, schema: str) -> str:
        if self.strategy == "topic":
            return f"{self.topic}-{self.part}"
        if self.fmt == "protobuf":
            return self.message(schema).name
        parsed = json.loads(schema)
        if self.fmt == "avro" and isinstance(parsed, dict) and parsed.get("name"):
            name = parsed["name"]
            return name if "." in name or not parsed.get("namespace") else f"{parsed['namespace']}.{name}"
        if isinstance(parsed, dict) and parsed.get("title"):
            return str(parsed["title"])
        raise ConfigurationError(f"kafka sink: subject_name_strategy='record' needs a named {self.part} schema (an "
                                 "Avro record, or a JSON Schema with a title); give record_name")


def part_writers(spec: Mapping[str, Any]) -> list[PartWriter]:
    """The parts the spec writes in the wire format."""
    writers = []
    for part in PARTS:
        fmt = spec.get(f"{part}_format")
        if fmt is None:
            continue
        if fmt not in WRITE_FORMATS:
            raise ConfigurationError(f"kafka sink: {part}_format={fmt!r} is not supported; choose avro, json_schema "
                                     "or protobuf")
        schema = spec.get(f"{part}_schema")
        writers.append(PartWriter(part, fmt, spec["topic"], json.dumps(schema) if isinstance(schema, dict) else schema,
                                  spec.get("subject_name_strategy") or "topic", spec.get("record_name"),
                                  bool(spec.get("register_schemas"))))
    return writers


def schema_id(registry: Registry, writer: PartWriter, schema: str) -> int:
    """The id of `schema` under the writer's subject; registered only when allowed; else the registry's reason."""
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if writer.fmt == "protobuf":
        writer.message(schema)  # a .proto that does not compile says so, not "the subject lacks it"
    subject = writer.subject(schema)
    candidate = Schema(schema, SCHEMA_TYPES[writer.fmt])
    client = registry.client()

    def lookup() -> Any:
        try:
            return client.lookup_schema(subject, candidate)
        except SchemaRegistryError as exc:
            if getattr(exc, "http_status_code", None) == 404:
                return None
            raise

    found = registry.call(f"look up the {writer.part} schema under subject {subject!r}", lookup)
    if found is not None:
        return int(found.schema_id)
    if not writer.register:
        verdict = _compatibility(registry, subject, candidate)
        raise ConfigurationError(
            f"kafka sink: subject {subject!r} has no version with the {writer.part} schema the sink writes "
            f"({verdict}) and register_schemas is off: register it in the registry, or set register_schemas=True. "
            f"The schema: {schema[:500]}")

    def register() -> Any:
        try:
            return client.register_schema(subject, candidate)
        except SchemaRegistryError as exc:
            if getattr(exc, "http_status_code", None) in (409, 422):
                raise ConfigurationError(f"kafka sink: the Schema Registry refused the {writer.part} schema for "
                                         f"subject {subject!r}: {exc.error_message}. Change the schema (or the "
                                         "subject's compatibility level) so that the subject accepts it") from exc
            raise

    return int(registry.call(f"register the {writer.part} schema under subject {subject!r}", register))


def _compatibility(registry: Registry, subject: str, candidate: Any) -> str:
    """What the registry says of the schema under the subject, for the message of a refusal."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        compatible = registry.client().test_compatibility(subject, candidate)
    except SchemaRegistryError as exc:
        return f"the registry says: {exc.error_message}"
    except Exception as exc:  # the registry was just reached; say what failed without hiding the main error
        return f"its compatibility could not be tested: {exc}"
    return "the registry would accept it as compatible" if compatible else \
        "the registry says it is NOT compatible with the subject's versions"


def encoded(frame: Any, writers: list[PartWriter], config: PipelineConfig | None) -> Any:
    """`frame` with `value` (and `key`) as wire-format bytes, the registry's ids resolved first (driver)."""
    from pyspark.sql import functions as F

    if config is None or not config.schema_registry:
        raise ConfigurationError("kafka sink: value_format / key_format write through a Schema Registry: give the "
                                 "pipeline schema_registry_conn_id='<a schema_registry connection>'")
    registry = Registry(config)
    types = {f.name: f.dataType for f in frame.schema.fields}
    columns: dict[str, Any] = {}
    for writer in writers:
        if writer.part == "key":
            if "key" not in types:
                raise ConfigurationError("kafka sink: key_format is set but the output has no 'key' column")
            column, spark_type = F.col("key"), types["key"]
        elif "value" in types and types["value"].typeName() == "struct":
            column, spark_type = F.col("value"), types["value"]
        else:
            names = [n for n in types if n not in ("key", "headers")]
            column = F.struct(*(F.col(f"`{n}`") for n in names))
            spark_type = frame.select(column.alias("v")).schema["v"].dataType
        present = column
        if writer.fmt == "protobuf" and spark_type.typeName() != "struct":  # a message of one field, the part's
            column = F.struct(column.alias(writer.part))
            spark_type = frame.select(column.alias("v")).schema["v"].dataType
        schema = writer.schema or writer.derived_schema(spark_type)
        prefix = f"00{schema_id(registry, writer, schema):08x}"
        if writer.fmt == "protobuf":
            indexes, body = _protobuf_body(writer, schema, column, spark_type)
            prefix += indexes
        elif writer.fmt == "avro":
            from pyspark.sql.avro.functions import to_avro

            body = to_avro(column, schema)
        else:
            body = F.encode(F.to_json(column) if spark_type.typeName() in ("struct", "map", "array")
                            else F.to_json(F.array(column)).substr(F.lit(2), F.length(F.to_json(F.array(column))) - 2),
                            "UTF-8")
        columns[writer.part] = F.when(present.isNull(), F.lit(None).cast("binary")).otherwise(
            F.concat(F.unhex(F.lit(prefix)), body))
    kept = [c for c in ("key", "value", "headers") if c in types and c not in columns]
    return frame.select(*(F.col(c) for c in kept), *(v.alias(k) for k, v in columns.items()))


def _protobuf_body(writer: PartWriter, schema: str, column: Any, spark_type: Any) -> tuple[str, Any]:
    """The message indexes (hex) and the serialized message of each row, by the protobuf runtime in a Python UDF
    from the descriptor set compiled here; the columns are checked against the message's fields first."""
    from pyspark.sql import functions as F

    message = writer.message(schema)
    type_json = spark_type.jsonValue()
    protobuf_encode.check_columns(type_json, message.descriptor_set, message.name, writer.part)
    descriptor_set, name, type_text = message.descriptor_set, message.name, json.dumps(type_json)
    serialize = F.udf(lambda row: protobuf_encode.encode(descriptor_set, name, type_text, row), "binary")
    return message_indexes(list(message.indexes)).hex(), serialize(column)


def check_given_schemas(spec: Mapping[str, Any], config: PipelineConfig | None) -> None:
    """At plan time: a schema given in the spec must be in its subject (or registrable there)."""
    given = [(w, w.schema) for w in part_writers(spec) if w.schema is not None]
    if not given:
        return
    if config is None or not config.schema_registry:
        raise ConfigurationError("kafka sink: value_format / key_format write through a Schema Registry: give the "
                                 "pipeline schema_registry_conn_id='<a schema_registry connection>'")
    registry = Registry(config)
    for writer, schema in given:
        schema_id(registry, writer, schema)
