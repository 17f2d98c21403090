"""How many transactional ids a Kafka-sink pipeline leaves on the coordinators after N batches, per naming.

A local broker (or --bootstrap); for each naming (`per_batch`: the first releases' ids, one set per
batch; `pooled`: this release's default, a fixed set reused across batches), one pipeline runs
--batches batches through the coordinator and a SQLite ledger, each batch one record per partition
written by the sink's partition writer (librdkafka, pre-committed) and committed by notify_complete's
path. Then it counts the pipeline's ids that ListTransactions reports (the broker keeps each for
transactional.id.expiration.ms, 7 days by default) and prints one JSON line per naming.

    PYTHONPATH=. python benchmarks/bench_kafka_transactional_ids.py                  # 1,000 batches, 1 partition
    PYTHONPATH=. python benchmarks/bench_kafka_transactional_ids.py --batches 200 --partitions 4
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import uuid
from pathlib import Path

from kafka import KafkaAdminClient

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import create_committer
from airflow_exactly_once.sinks.kafka import probe
from airflow_exactly_once.sinks.kafka.committable import KafkaCommittable
from airflow_exactly_once.sinks.kafka.writer import KafkaPartitionWriter
from devtools.kafka_broker import LocalKafkaBroker
from tests.helpers import create_topic


def run(bootstrap: str, naming: str, batches: int, partitions: int, folder: Path) -> dict:
    name = f"bench-ids-{naming.replace('_', '')}-{uuid.uuid4().hex[:6]}"
    output = f"{name}-out"
    create_topic(bootstrap, output, partitions)
    config = checked(PipelineConfig(pipeline_id=name, topics=[f"{name}-in"], bootstrap_servers=bootstrap,
                                    sink={"type": "kafka", "topic": output, "transactional_ids": naming}))
    ledger = Ledger(f"sqlite:///{folder / (name + '.db')}")
    ledger.create_schema()
    coordinator = BatchCoordinator(config, ledger, create_committer(config.sink))
    ledger.ensure_pipeline(name, config.fingerprint(), config.to_stored_dict())
    ids = coordinator.sink.output.naming
    settings = KafkaSettings.of(config)
    started = time.perf_counter()
    for seq in range(1, batches + 1):
        batch = ledger.create_batch(name, f"run-{seq}", [OffsetRange(f"{name}-in", 0, seq - 1, seq)],
                                    expected_epoch=ledger.pipeline(name)["epoch"])
        claimed = coordinator.claim(batch.id)
        ids.ensure_free(claimed, ledger)
        writer = KafkaPartitionWriter(output, "EXACTLY_ONCE", name, seq, 120_000, settings, {}, naming=ids)
        reports = tuple(writer.write_records(p, [(None, f"{seq}-{p}".encode())]) for p in range(partitions))
        coordinator.prepare(claimed, KafkaCommittable("EXACTLY_ONCE", bootstrap, output, reports,
                                                      ids.slot(seq)), 1, partitions)
        coordinator.commit(claimed.id)
    seconds = time.perf_counter() - started
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        live = probe.matching_transactions(admin, KafkaSettings(bootstrap), ids.pipeline_pattern())
    finally:
        admin.close()
    return {"naming": naming, "batches": batches, "partitions": partitions, "ids_on_coordinator": len(live),
            "seconds_per_batch": round(seconds / batches, 4), "load_average": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=1, help="Spark partitions (writers) per batch")
    parser.add_argument("--bootstrap", help="an existing broker (default: start a local one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ids-") as folder:
        broker = None if args.bootstrap else LocalKafkaBroker(Path(folder) / "kafka").start()
        try:
            bootstrap = args.bootstrap or broker.bootstrap_servers
            for naming in ("per_batch", "pooled"):
                print(json.dumps(run(bootstrap, naming, args.batches, args.partitions, Path(folder))), flush=True)
        finally:
            if broker is not None:
                broker.stop()


if __name__ == "__main__":
    main()
