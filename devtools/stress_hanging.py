"""How often a broker killed mid-transaction leaves a hanging transaction (KIP-664), per Kafka release.

    python -m devtools.stress_hanging --kafka 4.4.0 --trials 12
    python -m devtools.stress_hanging --kafka 3.9.1 --trials 12

Each trial writes a batch as the Kafka sink does (two writers, each a transaction over the three
partitions of a fresh output topic, pre-committed), then SIGKILLs the broker at a random moment of one
scenario and starts it again 3 s later:

- `timeout-abort`: nobody commits; the kill lands around the coordinator's own abort of the expired
  transactions (transaction_timeout_ms, then the broker's 1 s cleanup interval);
- `expired-notify`: the transactions expired, then notify_complete runs (the sink's commit, judging the
  lost transactions by the output); the kill lands during it, as in the outside campaign's finding;
- `commit`: notify_complete commits in time; the kill lands during the EndTxn and its markers.

After the restart it waits until the transactions must have been ended (their timeout and cleanup, plus
10 s), then looks for hanging transactions (sinks.kafka.hanging.scan: open in a partition, not open at
the coordinator). The sink runs without the ledger's history, so it ends none of them itself: this
counts what Kafka leaves, not what the provider mends. Each trial also counts the broker's log lines saying its
coordinator completed the trial's transactions without sending some markers ("partitions are likely deleted
already and hence can be skipped"). A stress tool, not a test: it prints its counts.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import create_committer
from airflow_exactly_once.sinks.kafka import hanging
from airflow_exactly_once.sinks.kafka.committable import KafkaCommittable
from airflow_exactly_once.sinks.kafka.writer import KafkaPartitionWriter
from devtools.kafka_broker import LocalKafkaBroker

SCENARIOS = ("timeout-abort", "expired-notify", "commit")
TIMEOUT_MS = 3000


def write_batch(config: PipelineConfig, seq: int) -> KafkaCommittable:
    """Two pre-committed transactions, each over every partition of the output (keys spread them)."""
    settings = KafkaSettings.of(config)
    writer = KafkaPartitionWriter(config.sink["topic"], "EXACTLY_ONCE", config.pipeline_id, seq, TIMEOUT_MS,
                                  settings, {})
    reports = tuple(writer.write_records(p, [(f"{p}-{i}".encode(), b"v") for i in range(60)]) for p in (0, 1))
    return KafkaCommittable("EXACTLY_ONCE", settings.bootstrap_servers, config.sink["topic"], reports)


def kill_and_restart(broker: LocalKafkaBroker, pause_s: float = 3.0) -> None:
    broker.process.kill()
    broker.process.wait()
    broker.process = None
    time.sleep(pause_s)
    broker.start(timeout=180)


def notify_complete(config: PipelineConfig, committable: KafkaCommittable, seq: int, said: list[str]) -> None:
    sink = create_committer(config.sink).bind(config)  # no history: it ends no hanging transaction itself
    batch = Batch(config.pipeline_id, seq, "stress", BatchState.PREPARED, 1, ())
    try:
        said.append(sink.commit(batch, committable)[:60])
    except Exception as exc:  # noqa: BLE001 - a stress tool records what each attempt met
        said.append(f"{type(exc).__name__}")


# What the broker's transaction coordinator logs when it completes a transaction without writing some of its
# markers, because its metadata cache does not know the partitions' leaders yet (right after a restart).
SKIPPED_MARKERS = "these partitions are likely deleted already and hence can be skipped"


def skipped_markers(broker: LocalKafkaBroker, name: str) -> int:
    """How many times the coordinator skipped the markers of this trial's transactions."""
    return sum(1 for line in broker.log_file.read_text(errors="replace").splitlines()
               if SKIPPED_MARKERS in line and name in line)


def trial(broker: LocalKafkaBroker, scenario: str, rng: random.Random) -> tuple[int, float, list[str], list[str]]:
    name = f"stress-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        admin.create_topics([NewTopic(f"{name}-out", 3, 1)])
    finally:
        admin.close()
    time.sleep(0.5)
    config = checked(PipelineConfig(pipeline_id=name, topics=[f"{name}-in"],
                                    sink={"type": "kafka", "topic": f"{name}-out", "transaction_timeout_ms": TIMEOUT_MS},
                                    bootstrap_servers=broker.bootstrap_servers))
    committable = write_batch(config, 1)
    said: list[str] = []
    if scenario == "timeout-abort":
        delay = rng.uniform(TIMEOUT_MS / 1000 - 0.5, TIMEOUT_MS / 1000 + 2.0)
        time.sleep(delay)
        kill_and_restart(broker)
    else:
        if scenario == "expired-notify":
            time.sleep(TIMEOUT_MS / 1000 + 3.0)
        delay = rng.uniform(0.0, 1.5 if scenario == "expired-notify" else 0.3)
        worker = threading.Thread(target=notify_complete, args=(config, committable, 1, said), daemon=True)
        worker.start()
        time.sleep(delay)
        kill_and_restart(broker)
        worker.join(120)
    time.sleep(TIMEOUT_MS / 1000 + 10.0)
    known = {r.transaction.producer_id: r.transactional_id for r in committable.transactions}
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        found = hanging.scan(admin, [(f"{name}-out", p) for p in range(3)], known)
    finally:
        admin.close()
    said.append(f"markers skipped by the coordinator: {skipped_markers(broker, name)}")
    return len(found.hanging), delay, [h.describe() for h in found.hanging], said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.stress_hanging", description=__doc__.split("\n")[0])
    parser.add_argument("--kafka", default=None, help="the broker release (default: the tests' own)")
    parser.add_argument("--trials", type=int, default=12, help="trials per scenario")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="(repeatable) default: all")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep-log", help="copy the broker's log here at the end")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    counts: Counter = Counter()
    with tempfile.TemporaryDirectory(prefix="stress-hanging-") as folder:
        broker = LocalKafkaBroker(Path(folder), version=args.kafka).start()
        print(f"Kafka {broker.version}, transaction_timeout_ms={TIMEOUT_MS}, {args.trials} trials per scenario")
        with contextlib.ExitStack() as stack:
            stack.callback(broker.stop)
            if args.keep_log:
                stack.callback(lambda: shutil.copyfile(broker.log_file, args.keep_log))
            for scenario in args.scenario or SCENARIOS:
                for n in range(args.trials):
                    found, delay, described, said = trial(broker, scenario, rng)
                    counts[scenario, "trials"] += 1
                    counts[scenario, "hanging"] += bool(found)
                    print(f"{scenario:15} #{n + 1:<3} kill at {delay:5.2f} s: {found} hanging "
                          f"{'; '.join(described)} {' | '.join(said)}", flush=True)
    print("\nscenario         trials  with a hanging transaction")
    for scenario in args.scenario or SCENARIOS:
        print(f"{scenario:15} {counts[scenario, 'trials']:7} {counts[scenario, 'hanging']:7}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
