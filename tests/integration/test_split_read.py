"""A large batch read split into more Spark partitions than Kafka's (spark.batch_read.read_layout), on real Kafka
and Spark: split points fall inside transactions, committed and aborted, and next to a bad record; the output
(Parquet, or Kafka with the parts joined into a task per core) still holds every committed record once and
nothing aborted, and the bad record goes by its policy."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import confluent_kafka
import pytest

from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.spark import batch_read, write_job
from airflow_exactly_once.spark.partition_writers import run_partition_writers
from tests.harness import Pipe, open_ledger, pipeline_config
from tests.helpers import create_topic, read_parquet
from tests.kafka_helpers import read_all

PER_TRANSACTION = 30
BAD_AT = 130  # in the fifth transaction, a committed one


def produce_transactions(bootstrap: str, topic: str) -> list[int]:
    """Six transactions over both partitions, every other one aborted, and a bad value in a committed one; the
    ids of the good committed records."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": f"split-{topic}"})
    producer.init_transactions(30)
    committed, n = [], 0
    for transaction in range(6):
        producer.begin_transaction()
        for _ in range(PER_TRANSACTION):
            value = json.dumps({"id": n}).encode() if n != BAD_AT else b'{"id": '
            producer.produce(topic, value, partition=n % 2)
            if transaction % 2 == 0 and n != BAD_AT:
                committed.append(n)
            n += 1
        producer.flush(30)
        if transaction % 2 == 0:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    return committed


@pytest.mark.parametrize("sink", ["parquet", "kafka"])
def test_a_split_read_writes_each_committed_record_once(kafka, spark, tmp_path: Path, monkeypatch, sink):
    """Parquet: 4 parts, a file each. Kafka (a transaction per Spark partition): the 4 parts joined again into
    2 tasks, so 2 transactions."""
    topic = f"split-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap_servers, topic, partitions=2)
    committed = produce_transactions(kafka.bootstrap_servers, topic)
    monkeypatch.setattr(batch_read, "SPLIT_PART_RECORDS", 10)  # this batch counts as large
    out = tmp_path / "out"
    if sink == "kafka":
        create_topic(kafka.bootstrap_servers, f"{topic}-out", partitions=2)
        spec, transform = {"type": "kafka", "topic": f"{topic}-out"}, lambda df: df.selectExpr(
            "CAST(id AS STRING) AS value")
    else:
        spec, transform = {"type": "parquet", "path": str(out)}, lambda df: df.select("id")
    config = pipeline_config(f"{topic}-p", [topic], spec, bootstrap=kafka.bootstrap_servers, value_format="json",
                             value_schema="id BIGINT", bad_record_policy="skip",
                             local_read_max_records=0)  # Spark's Kafka source, whose read is split
    p = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)),
             run_writers=run_partition_writers)
    batch = p.plan("run-1").batch
    # 2 ranges on local[2]: 2 parts each
    assert batch_read.read_layout(spark, batch, p.writer) == \
        batch_read.ReadLayout(parts=4, tasks=2 if sink == "kafka" else None)
    summary = write_job.run_write(spark, p.coordinator, batch.id, transform=transform)
    assert (summary["input_records"], summary["bad_records"]) == (len(committed) + 1, 1)
    p.commit(batch.id)
    if sink == "kafka":
        assert sorted(int(v) for v in read_all(kafka.bootstrap_servers, f"{topic}-out")) == committed
        writers = p.coordinator.ledger.get_batch(batch.id).handles["writers"]
        assert sorted(w["partition"] for w in writers) == [0, 1]
        return
    assert sorted(r["id"] for r in read_parquet(out)) == committed
    files = [f for f in out.rglob("*.parquet") if not any(part.startswith("_") for part in f.parts)]
    assert len(files) > 2, f"one file per Kafka partition: the read was not split ({files})"
