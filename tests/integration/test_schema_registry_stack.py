"""The dev tooling's Schema Registry (devtools/schema_registry.py) through confluent-kafka's own client, against
its Confluent-compatible API: what the registry-backed tests of the sinks will lean on."""

from __future__ import annotations

import json
import ssl

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

AVRO_V1 = {"type": "record", "name": "Event", "namespace": "eo.test", "fields": [{"name": "id", "type": "long"}]}
# v2 adds an optional field: a backward-compatible evolution.
AVRO_V2 = {**AVRO_V1, "fields": AVRO_V1["fields"] + [{"name": "note", "type": ["null", "string"], "default": None}]}
# id changes type: a reader of this schema cannot read what v2 wrote.
AVRO_INCOMPATIBLE = {**AVRO_V1, "fields": [{"name": "id", "type": "string"}]}
PROTO = 'syntax = "proto3";\npackage eo.test;\n\nmessage Event {\n  int64 id = 1;\n  string note = 2;\n}\n'
JSON_SCHEMA = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
               "properties": {"id": {"type": "integer"}}, "required": ["id"]}


def test_avro_versions_protobuf_and_json_schema_come_back_by_id(schema_registry, unique) -> None:
    client = SchemaRegistryClient(schema_registry.client_config())
    subject = f"events-{unique}-value"
    v1 = client.register_schema(subject, Schema(json.dumps(AVRO_V1), "AVRO"))
    v2 = client.register_schema(subject, Schema(json.dumps(AVRO_V2), "AVRO"))
    proto = client.register_schema(f"proto-{unique}-value", Schema(PROTO, "PROTOBUF"))
    json_schema = client.register_schema(f"json-{unique}-value", Schema(json.dumps(JSON_SCHEMA), "JSON"))

    assert len({v1, v2, proto, json_schema}) == 4
    assert client.get_versions(subject) == [1, 2]
    assert client.get_latest_version(subject).schema_id == v2
    assert json.loads(client.get_schema(v1).schema_str) == AVRO_V1
    assert json.loads(client.get_schema(v2).schema_str) == AVRO_V2
    fetched_proto = client.get_schema(proto)
    assert (fetched_proto.schema_type, fetched_proto.schema_str) == ("PROTOBUF", PROTO)
    fetched_json = client.get_schema(json_schema)
    assert fetched_json.schema_type == "JSON" and json.loads(fetched_json.schema_str) == JSON_SCHEMA


def test_an_incompatible_avro_schema_is_refused_with_its_reason(schema_registry, unique) -> None:
    client = SchemaRegistryClient(schema_registry.client_config())
    subject = f"compat-{unique}-value"
    client.register_schema(subject, Schema(json.dumps(AVRO_V1), "AVRO"))
    client.set_compatibility(subject, "BACKWARD")  # Apicurio's default is NONE

    assert client.test_compatibility(subject, Schema(json.dumps(AVRO_V2), "AVRO")) is True
    assert client.test_compatibility(subject, Schema(json.dumps(AVRO_INCOMPATIBLE), "AVRO")) is False
    # With ?verbose=true the reason comes back (Apicurio names it "reason", Confluent "messages").
    verbose = httpx.post(f"{schema_registry.url}/compatibility/subjects/{subject}/versions/latest?verbose=true",
                         json={"schema": json.dumps(AVRO_INCOMPATIBLE), "schemaType": "AVRO"},
                         auth=(schema_registry.user, schema_registry.password))
    assert verbose.status_code == 200 and verbose.json()["is_compatible"] is False
    assert "STRING not compatible with writer type: LONG" in verbose.json()["reason"]
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(AVRO_INCOMPATIBLE), "AVRO"))
    assert refused.value.http_status_code == 409 and "Incompatible" in refused.value.error_message
    assert client.get_versions(subject) == [1]


def test_a_wrong_password_or_none_gets_401(schema_registry) -> None:
    with pytest.raises(SchemaRegistryError) as refused:
        SchemaRegistryClient(schema_registry.client_config(password="not-the-password")).get_subjects()
    assert refused.value.http_status_code == 401
    assert httpx.get(f"{schema_registry.url}/subjects").status_code == 401
    assert httpx.get(f"{schema_registry.base_url}/health/ready").status_code == 401


def test_a_token_signed_with_the_registrys_key_is_a_user_and_any_other_gets_401(schema_registry, unique) -> None:
    subject = f"bearer-{unique}-value"
    token = schema_registry.bearer_token()
    schema_id = SchemaRegistryClient(schema_registry.bearer_client_config(token)).register_schema(
        subject, Schema(json.dumps(AVRO_V1), "AVRO"))
    assert SchemaRegistryClient(schema_registry.client_config()).get_latest_version(subject).schema_id == schema_id
    refused = {"expired": schema_registry.bearer_token(expires_in=-120),
               "another key": schema_registry.bearer_token(foreign_key=True),
               "another issuer": schema_registry.bearer_token(issuer="someone-else"),
               "tampered": token[:-8] + ("AAAAAAAA" if not token.endswith("AAAAAAAA") else "BBBBBBBB"),
               "not a JWT": "not-a-token"}
    for why, bad in refused.items():
        answer = httpx.get(f"{schema_registry.url}/subjects", headers={"Authorization": f"Bearer {bad}"})
        assert answer.status_code == 401, (why, answer.status_code, answer.text[:200])
        assert answer.headers.get("www-authenticate", "").lower().startswith("bearer"), why
    with pytest.raises(SchemaRegistryError) as caught:
        SchemaRegistryClient(schema_registry.bearer_client_config(refused["expired"])).get_subjects()
    assert caught.value.http_status_code == 401
    # basic auth still answers beside it (the registry's user and the other users it was given)
    for login, password in schema_registry.users.items():
        assert httpx.get(f"{schema_registry.url}/subjects", auth=(login, password)).status_code == 200, login


def test_https_requires_a_client_certificate(schema_registry, unique) -> None:
    subject = f"tls-{unique}-value"
    schema_id = SchemaRegistryClient(schema_registry.tls_client_config()).register_schema(
        subject, Schema(json.dumps(AVRO_V1), "AVRO"))
    assert SchemaRegistryClient(schema_registry.client_config()).get_schema(schema_id).schema_str
    no_certificate = ssl.create_default_context(cafile=str(schema_registry.tls_dir / "ca.pem"))
    with pytest.raises(httpx.HTTPError, match="(?i)certificate"):
        httpx.get(f"{schema_registry.https_url}/subjects", verify=no_certificate,
                  auth=(schema_registry.user, schema_registry.password))


def test_a_restart_on_the_same_port_keeps_the_schemas_and_their_ids(schema_registry, unique) -> None:
    """SIGKILLed right after the write, as a lost machine: what was acknowledged is on disk."""
    subject = f"restart-{unique}-value"
    schema_id = SchemaRegistryClient(schema_registry.client_config()).register_schema(
        subject, Schema(json.dumps(AVRO_V1), "AVRO"))
    port = schema_registry.port
    schema_registry.kill()
    try:
        # Down: nothing listens (the client's HTTP library raises its own ConnectError).
        with pytest.raises(Exception, match="Connection refused"):
            SchemaRegistryClient({**schema_registry.client_config(), "max.retries": 0}).get_subjects()
    finally:
        schema_registry.start()
    assert schema_registry.port == port
    client = SchemaRegistryClient(schema_registry.client_config())
    assert json.loads(client.get_schema(schema_id).schema_str) == AVRO_V1
    assert client.get_latest_version(subject).schema_id == schema_id
