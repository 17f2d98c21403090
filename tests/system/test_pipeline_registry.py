"""The example DAG of the registry formats in a real Airflow, its write SIGKILLed once after staging.

dags/kafka_to_parquet_registry.py reads Avro in the wire format through the `schema_registry`
connection (the real Apicurio registry, basic auth): two schema versions mixed, a value that is
not in the wire format and a truncated one. The first write attempt is killed after its output
and dead letters are staged; Airflow retries it, and the committed output holds every paid order
once, the dead letters every bad record once.
"""

from __future__ import annotations

import json
import uuid

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.states import BatchState
from tests.conftest import REGISTRY_EXAMPLE_TOPIC
from tests.harness import airflow_ledger
from tests.helpers import create_topic, read_parquet, staging_leftovers

DAG_ID = "kafka_to_parquet_registry"
V1 = {"type": "record", "name": "Order", "namespace": "shop",
      "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"},
                 {"name": "amount", "type": "double"}, {"name": "status", "type": "string"}]}
V2 = {**V1, "fields": V1["fields"] + [{"name": "note", "type": ["null", "string"], "default": None}]}


def test_example_dag_reads_two_versions_through_a_killed_write_exactly_once(kafka, airflow, schema_registry, faults,
                                                                            warm_spark, example_lakehouse):
    topic = REGISTRY_EXAMPLE_TOPIC
    create_topic(kafka.bootstrap_servers, topic, partitions=1)
    client = SchemaRegistryClient(schema_registry.client_config())
    context = SerializationContext(topic, MessageField.VALUE)
    serializers = (AvroSerializer(client, json.dumps(V1)), AvroSerializer(client, json.dumps(V2)))
    values, paid = [], []
    for i in range(120):
        status = "PAID" if i % 3 else "NEW"
        record = {"id": i, "item": f"item-{i}", "amount": i * 1.5, "status": status}
        if i % 2:
            record["note"] = f"note-{i}"
        values.append(serializers[i % 2](record, context))
        if status == "PAID":
            paid.append((i, record.get("note")))
    bad = [b'{"id": 1}', values[1][:-3]]  # not in the wire format; truncated
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "acks": "all"})
    for value in values + bad:
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(30) == 0
    airflow.put_connection("schema_registry_default", {
        "conn_type": "schema_registry", "host": schema_registry.url, "login": schema_registry.user,
        "password": schema_registry.password})
    airflow.wait_for_dag(DAG_ID)
    arm(faults, "write.after_stage", "kill", times=1)
    run_id = f"registry-{uuid.uuid4().hex[:6]}"
    assert airflow.run(DAG_ID, run_id) == "success"
    assert (faults / "fired.log").read_text().count("write.after_stage") == 1, "the write was never killed"
    assert airflow.task_states(DAG_ID, run_id)["write"] == ("success", 2)
    output = example_lakehouse.parent / "orders_avro"
    rows = read_parquet(output)
    assert sorted((r["id"], r["note"]) for r in rows) == sorted(paid)  # v1's records: note = the default (null)
    letters = read_parquet(output / "_dead_letter")
    assert sorted(r["source_offset"] for r in letters) == [120, 121]
    assert "not in the Schema Registry wire format" in letters[0]["error"] + letters[1]["error"]
    assert "truncated or corrupt Avro data" in letters[0]["error"] + letters[1]["error"]
    assert staging_leftovers(output) == []
    [batch] = airflow_ledger(airflow).list_batches("orders_avro")
    assert batch.state is BatchState.COMMITTED
    assert schema_registry.password not in json.dumps(batch.details or {})
