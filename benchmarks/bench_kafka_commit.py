"""The Kafka sink's notify_complete (KafkaSinkCommitter.commit) and its writers' pre-commit, without Spark.

A local broker (or --bootstrap); per round, --transactions partition writers (librdkafka, as the
Spark executors run them) each write --records records into one output topic and leave their
transaction open, then KafkaSinkCommitter.commit commits the batch. Prints per round the write of one
partition (median), its release (DescribeTransactions before and after releasing the producer),
and the commit of all transactions; then the medians of the rounds and the load average. Each round
commits two batches, side by side: one as notify_complete does (the sink bound to the ledger's history,
so it first looks for hanging transactions in the output: DescribeProducers, docs/sinks/kafka.md), one
without that look (the commit alone, as before the look existed).

    PYTHONPATH=. python benchmarks/bench_kafka_commit.py                       # 12 transactions, 5 rounds
    PYTHONPATH=. python benchmarks/bench_kafka_commit.py --transactions 4 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import create_committer
from airflow_exactly_once.sinks.kafka import librdkafka
from airflow_exactly_once.sinks.kafka.committable import KafkaCommittable
from airflow_exactly_once.sinks.kafka.writer import KafkaPartitionWriter
from devtools.kafka_broker import LocalKafkaBroker
from tests.helpers import create_topic


class Timed:
    """Wraps librdkafka.release_keeping_transaction to time each call (the writer looks it up per call)."""

    def __init__(self) -> None:
        self.original = librdkafka.release_keeping_transaction
        self.seconds: list[float] = []

    def __call__(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self.original(*args, **kwargs)
        finally:
            self.seconds.append(time.perf_counter() - started)


def one_round(bootstrap: str, transactions: int, records: int, seq: int, look: bool) -> dict:
    name = f"bench-commit-{uuid.uuid4().hex[:6]}"
    output = f"{name}-out"
    create_topic(bootstrap, output, transactions)
    config = checked(PipelineConfig(pipeline_id=name, topics=[f"{name}-in"], bootstrap_servers=bootstrap,
                                    sink={"type": "kafka", "topic": output, "transaction_timeout_ms": 900_000}))
    # A coordinator binds the ledger's history; it is read only when a hanging transaction is found (none here).
    sink = create_committer(config.sink).bind(config, history=(lambda: []) if look else None)
    writer = KafkaPartitionWriter(output, "EXACTLY_ONCE", name, seq, 900_000, KafkaSettings.of(config))
    timed = Timed()
    librdkafka.release_keeping_transaction = timed
    writes = []
    try:
        reports = []
        for partition in range(transactions):
            pairs = [(f"{partition}-{i}".encode(), b"x" * 100) for i in range(records)]
            started = time.perf_counter()
            reports.append(writer.write_records(partition, pairs))
            writes.append(time.perf_counter() - started)
    finally:
        librdkafka.release_keeping_transaction = timed.original
    committable = KafkaCommittable("EXACTLY_ONCE", bootstrap, output, tuple(reports))
    batch = Batch(name, seq, "bench", BatchState.PREPARED, 1, ())
    started = time.perf_counter()
    sink.commit(batch, committable)
    commit_s = time.perf_counter() - started
    started = time.perf_counter()
    sink.commit(batch, committable)  # notify_complete's retry after a success: a no-op
    again_s = time.perf_counter() - started
    return {"write_s": statistics.median(writes), "release_s": statistics.median(timed.seconds),
            "commit_s": commit_s, "commit_again_s": again_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=12, help="Spark partitions of the batch")
    parser.add_argument("--records", type=int, default=1000, help="records per transaction")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bootstrap", help="an existing broker; default: start a local one")
    args = parser.parse_args()

    load_before = os.getloadavg()
    broker = None if args.bootstrap else LocalKafkaBroker(Path(tempfile.mkdtemp(prefix="bench-commit-"))).start()
    bootstrap = args.bootstrap or broker.bootstrap_servers
    rounds = []
    try:
        for n in range(args.repeats):
            result = one_round(bootstrap, args.transactions, args.records, 2 * n + 1, look=True)
            alone = one_round(bootstrap, args.transactions, args.records, 2 * n + 2, look=False)
            result.update({"commit_without_look_s": alone["commit_s"],
                           "commit_again_without_look_s": alone["commit_again_s"]})
            print(f"round {n + 1}  write of one partition {result['write_s']:6.3f} s (release "
                  f"{result['release_s']:6.3f} s)  commit of {args.transactions} {result['commit_s']:6.3f} s "
                  f"(without the look {alone['commit_s']:6.3f} s)  again {result['commit_again_s']:6.3f} s "
                  f"({alone['commit_again_s']:6.3f} s)", flush=True)
            rounds.append(result)
    finally:
        if broker is not None:
            broker.stop()
    load_after = os.getloadavg()
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print(f"\nmedian of {args.repeats} round(s), {args.transactions} transactions of {args.records} records; load "
          f"average {load_before[0]:.1f} before, {load_after[0]:.1f} after:")
    for key, value in medians.items():
        print(f"{key:<16} {value:7.3f} s")
    print(json.dumps({"medians_s": medians, "load": [load_before, load_after], "rounds": rounds}))


if __name__ == "__main__":
    main()
