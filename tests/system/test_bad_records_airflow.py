"""End to end with bad records: output and dead letters exactly once through crashes (issue 12).

A real Airflow runs pipelines whose input holds good JSON records and bad ones (malformed,
a field of the wrong type, a tombstone, a poison record the transform cannot compute).
The task process is SIGKILLed after the write staged output and dead letters, and between
the dead letters' commit and the output's; every input record ends up exactly once in the
output or in the dead letters, and nothing is left staged.
"""

from __future__ import annotations

import json

import pytest
from kafka import KafkaProducer

from airflow_exactly_once.core.faults import arm
from tests.harness import airflow_ledger
from tests.helpers import assert_exactly_once, assert_ranges_tile, create_topic, read_parquet, staging_leftovers
from tests.kafka_helpers import read_all

BAD = [b'{"id": 1000, "amount"', b'{"id": "x", "amount": 1}', None, b'{"id": 1001, "amount": 0}', b"\x00\x01 binary",
       b'{"id": 1002, "amount": 0}', b'{"id": 1003, "amount": -5}']
# Why the transform's marks say each is bad (eo_test_transforms.guarded_share: guarded_column, mark_bad).
MARKED = {b'{"id": 1001, "amount": 0}': "ZeroDivisionError", b'{"id": 1002, "amount": 0}': "ZeroDivisionError",
          b'{"id": 1003, "amount": -5}': "a negative amount"}


def produce_with_bad_records(bootstrap: str, topic: str, good: int) -> tuple[list[int], dict[tuple[int, int], bytes]]:
    """`good` good records and BAD spread over 3 partitions; (good ids, {(partition, offset): bad value})."""
    create_topic(bootstrap, topic, partitions=3)
    values = [json.dumps({"id": i, "amount": i + 1}).encode() for i in range(good)]
    for n, value in enumerate(BAD):
        values.insert(n * good // len(BAD), value)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    futures = [(producer.send(topic, key=str(n).encode(), value=v, partition=n % 3), v) for n, v in enumerate(values)]
    producer.flush()
    producer.close()
    bad = {}
    for future, value in futures:
        meta = future.get(timeout=30)
        if value in BAD:
            bad[(meta.partition, meta.offset)] = value
    return list(range(good)), bad


def runs_until_done(airflow, dag: str, name: str, conf: dict, runs: int) -> None:
    for n in range(runs):
        assert airflow.run(dag, f"{name}-{n}", conf) == "success"


@pytest.mark.parametrize("point", ["write.after_stage", "notify.after_dead_letter_commit"])
def test_parquet_output_and_dead_letters_exactly_once_through_a_crash(kafka, airflow, faults, tmp_path, unique,
                                                                       point, warm_spark):
    name = f"badrec-{point.replace('.', '-').replace('_', '-')}-{unique}"
    good, bad = produce_with_bad_records(kafka.bootstrap_servers, name, 150)
    output = tmp_path / name
    conf = {"pipeline_id": name, "topic": name, "output": str(output), "max_records": 30,
            **warm_spark}  # 52 a partition: 2 batches
    airflow.wait_for_dag("eo_bad_records_parquet")
    arm(faults, point, "kill", times=1)
    runs_until_done(airflow, "eo_bad_records_parquet", name, conf, 2)
    assert (faults / "fired.log").read_text().count(point) == 1, "the crash point was never reached"
    assert_exactly_once([str(i) for i in good], [str(r["id"]) for r in read_parquet(output)])
    letters = read_parquet(output / "_dead_letter")
    assert sorted((r["source_partition"], r["source_offset"]) for r in letters) == sorted(bad)
    assert {(r["source_partition"], r["source_offset"]): r["value"] for r in letters} == bad
    for letter in letters:  # the transform's marks arrive through Airflow with their reasons
        if letter["value"] in MARKED:
            assert MARKED[letter["value"]] in letter["error"], letter
    assert sum(letter["value"] in MARKED for letter in letters) == len(MARKED)
    assert staging_leftovers(output) == [] and staging_leftovers(output / "_dead_letter") == []
    ledger = airflow_ledger(airflow)
    assert_ranges_tile(ledger, name)
    assert sum(b.details.get("bad_records", {}).get("count", 0) for b in ledger.list_batches(name)) == len(bad)


def test_kafka_output_and_dead_letters_exactly_once_when_killed_between_their_commits(kafka, airflow, faults, unique,
                                                                                      warm_spark):
    name = f"badrec-kafka-{unique}"
    good, bad = produce_with_bad_records(kafka.bootstrap_servers, name, 150)
    create_topic(kafka.bootstrap_servers, f"{name}-out", partitions=2)
    create_topic(kafka.bootstrap_servers, f"{name}-dlq", partitions=1)
    conf = {"pipeline_id": name, "topic": name, "output_topic": f"{name}-out", "dead_letter_topic": f"{name}-dlq",
            "max_records": 30, **warm_spark}
    airflow.wait_for_dag("eo_bad_records_kafka")
    arm(faults, "notify.after_dead_letter_commit", "kill", times=1)
    runs_until_done(airflow, "eo_bad_records_kafka", name, conf, 2)
    assert (faults / "fired.log").read_text().count("notify.after_dead_letter_commit") == 1
    out = [json.loads(v)["id"] for v in read_all(kafka.bootstrap_servers, f"{name}-out")]
    assert_exactly_once([str(i) for i in good], [str(i) for i in out])
    letters = read_all(kafka.bootstrap_servers, f"{name}-dlq")
    assert sorted(letters, key=str) == sorted((None if v is None else v.decode(errors="replace") for v in bad.values()),
                                              key=str)
    assert_ranges_tile(airflow_ledger(airflow), name)
