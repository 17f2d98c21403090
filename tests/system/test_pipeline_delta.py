"""End to end, Airflow running the tasks: Kafka -> Spark -> a Delta Lake table, exactly once.

dags/kafka_to_delta.py in the session's Airflow (its write on the warm Spark Connect server, its
commit by delta-rs in the notify_complete task): two DAG runs, two batches, read back with
delta-rs. Each batch is one table version carrying its application transaction; the two records
that are not JSON of the schema are in the `_dead_letter` Delta table; nothing staged is left.
"""

from __future__ import annotations

from deltalake import DeltaTable
from kafka import KafkaProducer

from airflow_exactly_once.core.states import BatchState
from tests.conftest import DELTA_EXAMPLE_TOPIC, example_delta_table
from tests.delta_helpers import delta_rows, delta_staged
from tests.harness import airflow_ledger
from tests.helpers import assert_exactly_once, assert_ranges_tile, create_topic, produce

DAG_ID = "kafka_to_delta"
BAD = [b'{"id": "not a number"}', b"not json"]


def test_example_dag_two_batches_one_version_each(kafka, airflow, warm_spark, example_lakehouse):
    create_topic(kafka.bootstrap_servers, DELTA_EXAMPLE_TOPIC, partitions=3)
    produce(kafka.bootstrap_servers, DELTA_EXAMPLE_TOPIC, 600, json_values=True)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    for n, value in enumerate(BAD):
        producer.send(DELTA_EXAMPLE_TOPIC, value=value, partition=n)
    producer.flush()
    producer.close()
    airflow.wait_for_dag(DAG_ID)
    for n in range(2):  # 150 per partition and batch: 450 + 152
        assert airflow.run(DAG_ID, f"delta_{n}") == "success"

    table = example_delta_table(example_lakehouse)
    rows = delta_rows(table)
    assert_exactly_once([str(i) for i in range(600)], [str(r["id"]) for r in rows])
    assert all(r["day"] == r["kafka_timestamp"].date() for r in rows)  # the partition column
    ledger = airflow_ledger(airflow)
    committed = ledger.list_batches(DAG_ID, [BatchState.COMMITTED], newest_first=False)
    assert [b.output_records for b in committed] == [450, 150]
    history = sorted(DeltaTable(str(table)).history(), key=lambda c: c["version"])
    assert [c["version"] for c in history] == [0, 1, 2]  # created, then one version per batch
    assert [c.get("aeo.batch") for c in history[1:]] == [f"{DAG_ID}:{b.seq}" for b in committed]
    first = delta_rows(table, "id", version=1)  # time travel: the first batch alone
    assert len(first) == 450 and set(first) < {r["id"] for r in rows}

    letters = delta_rows(table / "_dead_letter")
    assert sorted(bytes(d["value"]) for d in letters) == sorted(BAD)
    assert {d["source_topic"] for d in letters} == {DELTA_EXAMPLE_TOPIC}
    assert delta_staged(table) == [] and delta_staged(table / "_dead_letter") == []
    assert_ranges_tile(ledger, DAG_ID)
