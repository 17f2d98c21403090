"""Topics in the Schema Registry wire format against a real registry (Apicurio, basic auth on), Kafka and Spark.

Records are produced by confluent-kafka's own serializers with two schema versions mixed in one
batch; the bad ones are every kind the policy knows: not in the wire format, an id the registry
does not know, a writer schema that does not resolve to the reader's (registered under another
subject), truncated data, a tombstone. Driven through spark.write_job.run_write and the coordinator,
as the write and notify_complete tasks do.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from airflow_exactly_once.airflow_integration.compat import BaseHook
from airflow_exactly_once.core.errors import BadRecordsError, ConfigurationError
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.hooks.schema_registry import SchemaRegistryHook
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.records.wire_format import frame
from airflow_exactly_once.spark.partition_writers import run_partition_writers
from airflow_exactly_once.spark.write_job import run_write
from devtools.ports import reserve_port
from tests.harness import Pipe, open_ledger, pipeline_config
from tests.helpers import create_topic, read_parquet

V1 = {"type": "record", "name": "Order", "namespace": "shop",
      "fields": [{"name": "id", "type": "int"}, {"name": "item", "type": "string"}]}
V2 = {"type": "record", "name": "Order", "namespace": "shop",
      "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"},
                 {"name": "note", "type": ["null", "string"], "default": None}]}
ALIEN = {"type": "record", "name": "Order", "namespace": "shop", "fields": [{"name": "id", "type": "string"}]}
JSON_V1 = {"type": "object", "properties": {"id": {"type": "integer"}, "item": {"type": "string"}},
           "required": ["id", "item"]}
JSON_V2 = {"type": "object", "properties": {"id": {"type": "integer"}, "item": {"type": "string"},
                                            "note": {"type": "string"}}, "required": ["id", "item"]}


def registry_settings(schema_registry, password: str | None = None, tls: str | None = None) -> dict:
    """Basic auth over HTTP; tls="certificate": HTTPS with the CA and a client certificate, "no-certificate": without."""
    if tls:
        return schema_registry.tls_client_config(with_certificate=tls == "certificate")
    return schema_registry.client_config(password)


def produce(kafka, topic: str, values: list[bytes | None], keys: list[bytes | None] | None = None) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "acks": "all"})
    for n, value in enumerate(values):
        producer.produce(topic, value=value, key=None if keys is None else keys[n], partition=0)
    assert producer.flush(30) == 0


def pipe(kafka, schema_registry, tmp_path: Path, topic: str, sink: dict, name: str = "p", password=None,
         tls=None, registry: dict | None = None, registry_conn_id: str = "registry_test", **settings) -> Pipe:
    """A pipeline over `topic`; its registry settings are `registry` (a connection's, as the hook makes them) or
    the session registry's user (another `password`, or over HTTPS)."""
    config = pipeline_config(f"{topic}-{name}", [topic], sink, bootstrap=kafka.bootstrap_servers,
                             schema_registry=registry or registry_settings(schema_registry, password, tls),
                             schema_registry_conn_id=registry_conn_id, **settings)
    made = Pipe(config, open_ledger(tmp_path / f"ledger-{name}.db"),
                lambda: KafkaOffsetSource(KafkaSettings.of(config)), run_writers=run_partition_writers)
    made.sink.check(config.pipeline_id)
    return made


@pytest.fixture
def avro_topic(kafka, schema_registry):
    """v1 and v2 records mixed, plus one of each kind of bad record; returns the topic, the good rows and the
    bad offsets with their reasons."""
    topic = f"sr-avro-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap_servers, topic, partitions=1)
    client = SchemaRegistryClient(registry_settings(schema_registry))
    context = SerializationContext(topic, MessageField.VALUE)
    v1 = AvroSerializer(client, json.dumps(V1))
    v2 = AvroSerializer(client, json.dumps(V2))
    # a schema of another subject whose data cannot be read as this topic's Order
    alien_id = client.register_schema(f"{topic}-other-value", Schema(json.dumps(ALIEN), "AVRO"))
    good, values = [], []
    for i in range(12):
        if i % 2:
            values.append(v2({"id": i, "item": f"item-{i}", "note": f"note-{i}"}, context))
            good.append((i, f"item-{i}", f"note-{i}"))
        else:
            values.append(v1({"id": i, "item": f"item-{i}"}, context))
            good.append((i, f"item-{i}", None))
    bad = {
        12: (json.dumps({"id": 99}).encode(), "not in the Schema Registry wire format"),
        13: (frame(987654, values[0][5:]), "unknown schema id 987654"),
        14: (frame(alien_id, b"\x06abc"), f"the writer schema id {alien_id} does not resolve to the reader schema"),
        15: (values[1][:-4], "truncated or corrupt Avro data of schema id"),
        16: (None, "a null value (a tombstone)"),
        17: (values[0] + b"\x02", "corrupt Avro data of schema id"),  # bytes after a v1 record (resolved to v2)
        18: (values[1] + b"\x00\x02", "bytes following the record"),  # ... after a v2 record (the reader's)
    }
    produce(kafka, topic, values + [value for value, _ in bad.values()])
    return topic, good, {offset: why for offset, (_, why) in bad.items()}


def test_two_avro_versions_decode_to_the_latest_and_every_bad_kind_is_a_dead_letter(
        kafka, spark, schema_registry, tmp_path, avro_topic):
    topic, good, bad = avro_topic
    out = tmp_path / "out"
    p = pipe(kafka, schema_registry, tmp_path, topic, {"type": "parquet", "path": str(out)}, value_format="avro",
             bad_record_policy="dead_letter")
    batch_id = p.plan("run-1").batch.id
    summary = run_write(spark, p.coordinator, batch_id, transform=lambda df: df.select("id", "item", "note"))
    assert (summary["input_records"], summary["output_records"], summary["bad_records"]) == (19, 12, 7)
    p.commit(batch_id)
    rows = read_parquet(out)
    assert sorted((r["id"], r["item"], r["note"]) for r in rows) == good  # v1's int id read as v2's long
    letters = {r["source_offset"]: r["error"] for r in read_parquet(out / "_dead_letter")}
    assert set(letters) == set(bad)
    for offset, why in bad.items():
        assert why in letters[offset], (offset, letters[offset])
    assert "does not resolve to the reader schema (subject" in letters[14] and "string" in letters[14]


def test_fail_names_the_reasons_and_skip_counts_them(kafka, spark, schema_registry, tmp_path, avro_topic):
    topic, good, bad = avro_topic
    failing = pipe(kafka, schema_registry, tmp_path, topic, {"type": "parquet", "path": str(tmp_path / "a")},
                   name="fail", value_format="avro")
    batch_id = failing.plan("run-1").batch.id
    with pytest.raises(BadRecordsError) as caught:
        run_write(spark, failing.coordinator, batch_id)
    assert f"7 of 19 records of batch {batch_id} are bad" in str(caught.value)
    assert "unknown schema id 987654" in str(caught.value) and caught.value.retriable is False
    assert failing.state(batch_id) is BatchState.PLANNED
    # skip, with a reader schema given by the user: v2's note is dropped, v1's int id promoted
    reader = {**V1, "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}]}
    skipping = pipe(kafka, schema_registry, tmp_path, topic, {"type": "parquet", "path": str(tmp_path / "b")},
                    name="skip", value_format="avro", value_schema=reader, bad_record_policy="skip",
                    max_bad_records=7)
    batch_id = skipping.plan("run-1").batch.id
    summary = run_write(spark, skipping.coordinator, batch_id)
    assert (summary["output_records"], summary["bad_records"]) == (12, 7)
    assert sorted((r["id"], r["item"]) for r in read_parquet(tmp_path / "b")) == []  # staged, not committed
    skipping.commit(batch_id)
    assert sorted((r["id"], r["item"]) for r in read_parquet(tmp_path / "b")) == [(i, item) for i, item, _ in good]
    details = skipping.ledger.get_batch(batch_id).details["bad_records"]
    assert {r["offset"] for r in details["first"]} == set(list(bad)[:5])


def test_an_unreachable_or_refusing_registry_is_a_configuration_error_and_the_retry_reads_the_same_batch(
        kafka, spark, schema_registry, tmp_path, avro_topic):
    topic, good, _ = avro_topic
    refused = pipe(kafka, schema_registry, tmp_path, topic, {"type": "parquet", "path": str(tmp_path / "r")},
                   name="refused", value_format="avro", bad_record_policy="skip", password="wrong")
    batch_id = refused.plan("run-1").batch.id
    with pytest.raises(ConfigurationError) as caught:
        run_write(spark, refused.coordinator, batch_id)
    assert "refused the credentials (HTTP 401)" in str(caught.value) and "'registry_test'" in str(caught.value)
    assert caught.value.retriable is False and "wrong" not in str(caught.value)

    out = tmp_path / "out"
    p = pipe(kafka, schema_registry, tmp_path, topic, {"type": "parquet", "path": str(out)}, name="down",
             value_format="avro", bad_record_policy="skip")
    batch_id = p.plan("run-1").batch.id
    schema_registry.stop()
    try:
        with pytest.raises(ConfigurationError) as caught:
            run_write(spark, p.coordinator, batch_id)
    finally:
        schema_registry.start()
    assert "cannot be reached" in str(caught.value) and caught.value.retriable is True
    assert p.state(batch_id) is not BatchState.PREPARED and read_parquet(out) == []
    summary = run_write(spark, p.coordinator, batch_id, transform=lambda df: df.select("id", "item", "note"))
    assert (summary["output_records"], summary["bad_records"]) == (12, 7)  # not one good record turned bad
    p.commit(batch_id)
    assert sorted((r["id"], r["item"], r["note"]) for r in read_parquet(out)) == good


def bearer_connection(monkeypatch, schema_registry, conn_id: str, token: str) -> dict:
    """A `schema_registry` connection as a deployment defines it (an AIRFLOW_CONN_ variable): Host the registry's
    URL, the token as Password, no Login; returns the client settings the provider's hook makes of it."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
        {"conn_type": "schema_registry", "host": schema_registry.url, "password": token}))
    settings = SchemaRegistryHook(conn_id).client_settings()
    assert "basic.auth.user.info" not in settings and settings["bearer.auth.token"] == token
    return settings


def test_a_bearer_token_connection_reads_the_wire_format_and_a_refused_token_is_a_configuration_error(
        kafka, spark, schema_registry, tmp_path, avro_topic, monkeypatch):
    topic, good, bad = avro_topic
    out = tmp_path / "out"
    token = schema_registry.bearer_token()
    p = pipe(kafka, schema_registry, tmp_path, topic, {"type": "parquet", "path": str(out)}, name="bearer",
             registry=bearer_connection(monkeypatch, schema_registry, "registry_bearer", token),
             registry_conn_id="registry_bearer", value_format="avro", bad_record_policy="dead_letter")
    batch_id = p.plan("run-1").batch.id
    summary = run_write(spark, p.coordinator, batch_id, transform=lambda df: df.select("id", "item", "note"))
    assert (summary["output_records"], summary["bad_records"]) == (12, 7)
    p.commit(batch_id)
    assert sorted((r["id"], r["item"], r["note"]) for r in read_parquet(out)) == good
    stored = p.ledger.pipeline(p.config.pipeline_id)["config"]
    assert stored["schema_registry"]["bearer.auth.token"] == "***" and token not in json.dumps(stored, default=str)

    # An expired token and one signed by a key the registry does not know: refused, not retried, no bad record.
    for name, refused_token in (("expired", schema_registry.bearer_token(expires_in=-120)),
                                ("stranger", schema_registry.bearer_token(foreign_key=True))):
        conn_id = f"registry_{name}"
        refused = pipe(kafka, schema_registry, tmp_path, topic, {"type": "parquet", "path": str(tmp_path / name)},
                       name=name, registry=bearer_connection(monkeypatch, schema_registry, conn_id, refused_token),
                       registry_conn_id=conn_id, value_format="avro", bad_record_policy="skip")
        batch_id = refused.plan("run-1").batch.id
        with pytest.raises(ConfigurationError) as caught:
            run_write(spark, refused.coordinator, batch_id)
        assert "refused the credentials (HTTP 401)" in str(caught.value) and f"'{conn_id}'" in str(caught.value)
        assert "bearer token" in str(caught.value), str(caught.value)
        assert caught.value.retriable is False and refused_token not in str(caught.value)
        assert refused.state(batch_id) is BatchState.PLANNED and read_parquet(tmp_path / name) == []


def test_json_schema_versions_decode_and_bad_records_say_why(kafka, spark, schema_registry, tmp_path):
    topic = f"sr-json-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap_servers, topic, partitions=1)
    client = SchemaRegistryClient(registry_settings(schema_registry))
    context = SerializationContext(topic, MessageField.VALUE)
    v1 = JSONSerializer(json.dumps(JSON_V1), client)
    v2 = JSONSerializer(json.dumps(JSON_V2), client)
    values = [v1({"id": 1, "item": "a"}, context), v2({"id": 2, "item": "b", "note": "n"}, context)]
    v2_id = int.from_bytes(values[1][1:5], "big")
    values += [frame(v2_id, b'{"item": "no id"}'), frame(v2_id, b'{"id": 3, "item": "c"} trailing'),
               frame(v2_id, b'{"id": "x", "item": "d"}')]
    produce(kafka, topic, values)
    out = tmp_path / "out"
    # over HTTPS: a client without the certificate the registry asks for is refused, not retried
    refused = pipe(kafka, schema_registry, tmp_path, topic, {"type": "parquet", "path": str(tmp_path / "x")},
                   name="nocert",
                   tls="no-certificate", value_format="json_schema", bad_record_policy="dead_letter")
    with pytest.raises(ConfigurationError) as caught:
        run_write(spark, refused.coordinator, refused.plan("run-1").batch.id)
    assert "refused the TLS handshake" in str(caught.value) and caught.value.retriable is False
    p = pipe(kafka, schema_registry, tmp_path, topic, {"type": "parquet", "path": str(out)}, tls="certificate",
             value_format="json_schema", bad_record_policy="dead_letter")
    batch_id = p.plan("run-1").batch.id
    summary = run_write(spark, p.coordinator, batch_id, transform=lambda df: df.select("id", "item", "note"))
    assert (summary["output_records"], summary["bad_records"]) == (2, 3)
    p.commit(batch_id)
    assert sorted((r["id"], r["item"], r["note"]) for r in read_parquet(out)) == [(1, "a", None), (2, "b", "n")]
    letters = {r["source_offset"]: r["error"] for r in read_parquet(out / "_dead_letter")}
    assert "the required property 'id' is missing" in letters[2]
    assert "content follows the value" in letters[3]
    assert "a property of another type" in letters[4]


def read_avro(kafka, client, topic: str, expected: int, keys: bool = False) -> list:
    """The committed values of `topic` (with keys: (key, value) pairs), decoded by confluent-kafka's
    AvroDeserializer."""
    deserializer = AvroDeserializer(client)
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    consumer.subscribe([topic])
    found = []
    try:
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is None or message.error():
                if len(found) >= expected:
                    break
                continue
            value = deserializer(message.value(), SerializationContext(topic, MessageField.VALUE))
            found.append((deserializer(message.key(), SerializationContext(topic, MessageField.KEY)), value)
                         if keys else value)
    finally:
        consumer.close()
    return found


def test_kafka_to_kafka_in_the_wire_format_reads_back_with_confluent_kafkas_deserializer(
        kafka, spark, schema_registry, tmp_path, avro_topic):
    topic, good, bad = avro_topic
    output = f"{topic}-out"
    create_topic(kafka.bootstrap_servers, output, partitions=2)
    client = SchemaRegistryClient(registry_settings(schema_registry))
    sink = {"type": "kafka", "topic": output, "value_format": "avro", "key_format": "avro"}
    # registering is off by default: the derived schema is not in the output's subject yet
    p = pipe(kafka, schema_registry, tmp_path, topic, sink, name="k2k-off", value_format="avro",
             bad_record_policy="skip")
    batch_id = p.plan("run-1").batch.id
    with pytest.raises(ConfigurationError) as caught:
        run_write(spark, p.coordinator, batch_id,
                  transform=lambda df: df.selectExpr("CAST(id AS STRING) AS key", "id", "item"))
    assert f"subject '{output}-value' has no version" in str(caught.value) and "register_schemas" in str(caught.value)

    dead_letters = f"{topic}-dlq"
    create_topic(kafka.bootstrap_servers, dead_letters, partitions=1)
    p = pipe(kafka, schema_registry, tmp_path, topic, {**sink, "register_schemas": True}, name="k2k",
             value_format="avro", bad_record_policy="dead_letter",
             dead_letter={"type": "kafka", "topic": dead_letters, "value_format": "avro", "register_schemas": True})
    batch_id = p.plan("run-1").batch.id
    run_write(spark, p.coordinator, batch_id,
              transform=lambda df: df.selectExpr("CAST(id AS STRING) AS key", "id", "item"))
    p.commit(batch_id)
    seen = [(key, value["id"], value["item"]) for key, value in read_avro(kafka, client, output, len(good), True)]
    assert sorted(seen) == sorted((str(i), i, item) for i, item, _ in good)
    # the dead letters, one Avro record each in the wire format: where the bad record came from, why, its bytes
    letters = read_avro(kafka, client, dead_letters, 5)
    assert sorted(letter["source_offset"] for letter in letters) == sorted(bad)
    assert all(bad[letter["source_offset"]] in letter["error"] for letter in letters)
    assert {letter["batch_id"] for letter in letters} == {str(batch_id)}

    # a given schema that the subject does not accept fails at plan time with the registry's reason
    client.set_compatibility(subject_name=f"{output}-value", level="BACKWARD")
    incompatible = {"type": "record", "name": f"{output.replace('-', '_')}_value",
                    "fields": [{"name": "id", "type": "string"}, {"name": "extra", "type": "int"}]}
    with pytest.raises(ConfigurationError) as caught:
        pipe(kafka, schema_registry, tmp_path, topic, {**sink, "register_schemas": True,
                                                       "value_schema": incompatible},
             name="k2k-bad", value_format="avro")
    assert "refused the value schema" in str(caught.value) or "NOT compatible" in str(caught.value)


def test_protobuf_versions_through_the_registry_and_the_write(kafka, spark, schema_registry, tmp_path):
    from airflow_exactly_once.records import protobuf_rows
    from airflow_exactly_once.records.registry import protobuf_reader
    from airflow_exactly_once.records.wire_format import message_indexes

    v1 = 'syntax = "proto3";\npackage shop;\nmessage Order { int64 id = 1; string item = 2; }\n'
    v2 = v1.replace("string item = 2;", "string item = 2; optional string note = 3;")
    topic = f"sr-proto-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap_servers, topic, partitions=1)
    client = SchemaRegistryClient(registry_settings(schema_registry))
    ids = [client.register_schema(f"{topic}-value", Schema(text, "PROTOBUF")) for text in (v1, v2)]
    classes = [protobuf_rows.message_class(protobuf_reader(text, {}, "test").descriptor_set, "shop.Order")
               for text in (v1, v2)]
    values = [frame(ids[0], message_indexes([0]) + classes[0](id=1, item="a").SerializeToString()),
              frame(ids[1], message_indexes([0]) + classes[1](id=2, item="b", note="n").SerializeToString()),
              frame(ids[1], message_indexes([0]) + classes[1](id=3, item="c").SerializeToString()[:-1])]
    produce(kafka, topic, values)
    out = tmp_path / "out"
    p = pipe(kafka, schema_registry, tmp_path, topic, {"type": "parquet", "path": str(out)},
             value_format="protobuf", bad_record_policy="dead_letter")
    batch_id = p.plan("run-1").batch.id
    summary = run_write(spark, p.coordinator, batch_id, transform=lambda df: df.select("id", "item", "note"))
    assert (summary["output_records"], summary["bad_records"]) == (2, 1)
    p.commit(batch_id)
    assert sorted((r["id"], r["item"], r["note"]) for r in read_parquet(out)) == [(1, "a", None), (2, "b", "n")]
    [letter] = read_parquet(out / "_dead_letter")
    assert letter["source_offset"] == 2 and "truncated or corrupt Protobuf data" in letter["error"]


def test_the_connection_forms_test_button_lists_subjects_and_says_what_refused(schema_registry, monkeypatch):
    """Airflow's Test button (Connection.test_connection through the hook of the connection's type) on the real
    registry: right credentials list its subjects; a wrong password and a stopped registry say which it was."""
    def tested(conn_id: str, **fields) -> tuple[bool, str]:
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "schema_registry", **fields}))
        return BaseHook.get_connection(conn_id).test_connection()

    ok, message = tested("registry_right", host=schema_registry.url, login=schema_registry.user,
                         password=schema_registry.password)
    assert ok and message.startswith(f"reached the Schema Registry at {schema_registry.url}: "), message
    ok, message = tested("registry_wrong", host=schema_registry.url, login=schema_registry.user, password="wrong")
    assert not ok and "refused the credentials (HTTP 401)" in message and "'registry_wrong'" in message, message
    ok, message = tested("registry_away", host=f"http://127.0.0.1:{reserve_port()}", login="x", password="y")
    assert not ok and "cannot be reached" in message, message
