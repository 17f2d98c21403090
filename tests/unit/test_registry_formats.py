"""The pure parts of reading the Schema Registry wire format: framing, message indexes, Avro schema resolution,
the connection's settings and where their secrets are."""

from __future__ import annotations

import json

import pytest

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.hooks.schema_registry import registry_settings
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.records import wire_format
from airflow_exactly_once.records.avro_resolution import resolution_problem
from airflow_exactly_once.records.registry import PartSchemas, add_writer, subjects

V1 = {"type": "record", "name": "Order", "namespace": "shop",
      "fields": [{"name": "id", "type": "int"}, {"name": "status", "type": {"type": "enum", "name": "Status",
                                                                          "symbols": ["NEW", "PAID"]}}]}
V2 = {"type": "record", "name": "Order", "namespace": "shop",
      "fields": [{"name": "id", "type": "long"}, {"name": "status", "type": "shop.Status"},
                 {"name": "note", "type": ["null", "string"], "default": None}]}
V2["fields"][1]["type"] = {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]}


def test_framing_round_trips_and_refuses_what_is_not_framed():
    framed = wire_format.frame(258, b"data")
    assert framed[:5] == b"\x00\x00\x00\x01\x02" and wire_format.schema_id(framed) == 258
    assert wire_format.schema_id(b"\x01\x00\x00\x00\x01x") is None  # another magic byte
    assert wire_format.schema_id(b"\x00\x00\x01") is None  # shorter than the header
    assert wire_format.schema_id(None) is None


@pytest.mark.parametrize("indexes", [[0], [1], [0, 2], [3, 1, 70]])
def test_protobuf_message_indexes_round_trip(indexes):
    encoded = wire_format.message_indexes(indexes)
    assert wire_format.read_message_indexes(encoded + b"\x08\x01") == (indexes, len(encoded))
    if indexes == [0]:
        assert encoded == b"\x00"


def test_truncated_message_indexes_are_an_error():
    with pytest.raises(ValueError, match="truncated"):
        wire_format.read_message_indexes(wire_format.message_indexes([1, 2])[:-1])


def test_avro_evolution_resolves_added_fields_with_defaults_and_promotions():
    assert resolution_problem(V1, V2) is None  # int -> long, an added field with a default, a new enum symbol
    assert resolution_problem(json.dumps(V1), json.dumps(V1)) is None


@pytest.mark.parametrize("reader, reason", [
    ({**V2, "fields": V2["fields"][:2] + [{"name": "qty", "type": "int"}]},
     "reader's field 'qty' is not in the writer's schema and has no default"),
    ({**V1, "fields": [{"name": "id", "type": "string"}]}, "writer's int at id cannot be read as the reader's string"),
    ({**V1, "name": "Invoice"}, "is not the reader's 'Invoice'"),
    ({**V1, "fields": [V1["fields"][0], {"name": "status", "type": {"type": "enum", "name": "Status",
                                                                      "symbols": ["NEW"]}}]},
     "symbols the reader lacks: PAID"),
])
def test_avro_pairs_that_do_not_resolve_say_why(reader, reason):
    assert reason in resolution_problem(V1, reader)


def test_a_narrowing_is_refused_and_a_union_takes_the_first_branch_that_fits():
    assert "long at id cannot be read as the reader's int" in resolution_problem(V2, V1)
    as_union = {**V1, "fields": [{"name": "id", "type": ["null", "long"]}]}
    assert resolution_problem(V1, as_union) is None
    assert "fits no branch" in resolution_problem(V1, {**V1, "fields": [{"name": "id", "type": ["null", "string"]}]})


def test_unresolvable_writers_are_kept_with_their_reason():
    schemas = PartSchemas("value", "avro", json.dumps(V2), "subject 'orders-value' version 2 (id 7)")
    add_writer(schemas, 6, json.dumps(V1))
    add_writer(schemas, 9, json.dumps({**V1, "fields": [{"name": "id", "type": "string"}]}))
    assert set(schemas.writers) == {6}
    assert "writer schema id 9 does not resolve to the reader schema (subject 'orders-value' version 2" in \
        schemas.unresolvable[9]
    assert schemas.known() == {6, 9}


def test_connection_fields_become_client_settings():
    assert registry_settings("registry", 8081, "app", "pw", {}, "sr") == {
        "url": "http://registry:8081", "basic.auth.user.info": "app:pw"}
    bearer = registry_settings("https://sr.example.com", None, None, "tok", {"ssl.ca.location": "/ca.pem"}, "sr")
    assert bearer["bearer.auth.token"] == "tok" and bearer["bearer.auth.credentials.source"] == "STATIC_TOKEN"
    assert bearer["url"] == "https://sr.example.com" and bearer["ssl.ca.location"] == "/ca.pem"
    with pytest.raises(Exception, match="has no Host"):
        registry_settings("", None, None, None, {}, "sr")


def _config(**overrides):
    values = dict(pipeline_id="p", topics=["orders", "refunds"], sink={"type": "parquet", "path": "/tmp/out"},
                  bootstrap_servers="k:9092", value_format="avro", schema_registry_conn_id="sr",
                  schema_registry={"url": "https://app:urlpw@sr:8081", "basic.auth.user.info": "app:pw",
                                   "ssl.key.password": "keypw"})
    values.update(overrides)
    return checked(PipelineConfig(**values))


def test_registry_secrets_are_never_stored_and_subjects_follow_topic_names():
    config = _config()
    stored = json.dumps(config.to_stored_dict())
    assert "pw" not in stored.replace("***", "") and "keypw" not in stored and "urlpw" not in stored
    assert ["schema_registry", "basic.auth.user.info"] in config.secret_paths
    assert subjects(config, "value") == ["orders-value", "refunds-value"]
    assert subjects(_config(value_subject="shop.Order"), "value") == ["shop.Order"]
    assert config.uses_registry("value") and not config.uses_registry("key")


def test_the_fingerprint_of_a_pipeline_without_the_new_settings_is_unchanged():
    plain = checked(PipelineConfig(pipeline_id="p", topics=["t"], sink={"type": "parquet", "path": "/o"},
                                   bootstrap_servers="k:9092"))
    assert plain.fingerprint() == "55ee7b77af00c76a"  # what the release before key_format computed
    assert _config(key_format="avro").fingerprint() != _config().fingerprint()


def test_a_json_schema_becomes_the_spark_columns_it_decodes_to():
    from airflow_exactly_once.records.json_schema import required_fields, spark_ddl, spark_type

    schema = {"type": "object", "required": ["id", "note"], "definitions": {
        "Address": {"type": "object", "properties": {"city": {"type": "string"}}}},
        "properties": {"id": {"type": "integer"}, "price": {"type": "number"}, "paid": {"type": "boolean"},
                       "tags": {"type": "array", "items": {"type": "string"}}, "address": {"$ref": "#/definitions/Address"},
                       "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
                       "note": {"type": ["null", "string"]}, "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}
    assert spark_ddl(schema) == ("`id` BIGINT, `price` DOUBLE, `paid` BOOLEAN, `tags` ARRAY<STRING>, "
                                 "`address` STRUCT<`city`: STRING>, `attrs` MAP<STRING, BIGINT>, `note` STRING, "
                                 "`either` STRING")
    assert required_fields(schema) == ["id"]  # note may be null
    assert spark_type({"type": "string"}) == "STRING"
    with pytest.raises(Exception, match="not an object with properties"):
        spark_ddl({"type": "string"})
    with pytest.raises(Exception, match="not a local reference"):
        spark_ddl({"type": "object", "properties": {"a": {"$ref": "http://example.com/a.json"}}})


def test_the_sink_names_subjects_by_topic_or_by_record_and_derives_named_schemas():
    from airflow_exactly_once.sinks.kafka.wire_format import part_writers

    [value] = part_writers({"topic": "orders", "value_format": "avro"})
    assert value.subject(json.dumps(V1)) == "orders-value"
    spark_type = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": False}]}
    derived = json.loads(value.derived_schema(spark_type))
    assert derived == {"type": "record", "name": "orders_value", "fields": [{"name": "id", "type": "long"}]}
    by_record = part_writers({"topic": "orders", "value_format": "avro", "subject_name_strategy": "record",
                              "record_name": "shop.Order"})[0]
    schema = by_record.derived_schema(spark_type)
    assert json.loads(schema)["namespace"] == "shop" and by_record.subject(schema) == "shop.Order"
    as_json = part_writers({"topic": "t", "value_format": "json_schema", "subject_name_strategy": "record"})[0]
    with pytest.raises(Exception, match="needs a named value schema"):
        as_json.subject(as_json.derived_schema(spark_type))
    with pytest.raises(Exception, match="value_format='xml' is not supported"):
        part_writers({"topic": "t", "value_format": "xml"})
