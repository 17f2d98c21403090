"""A node of a 3-node Kafka cluster away for minutes: Kafka -> Kafka and Kafka -> Parquet runs go on (issue 61).

    PYTHONPATH=. python benchmarks/bench_node_away.py [--minutes 10] [--records 300]

On a 3-node KRaft cluster of Kafka 4.4.0 (devtools/kafka_cluster.py: replication factor 3, min.insync.replicas=2),
two pipelines run whole batches (plan, write, notify_complete, each in a worker process of its own,
tests/worker_tasks.py, as Airflow's tasks run) one after the other, with records produced before each: first with
the whole cluster (a few runs, the baseline), then with one node SIGKILLed and left down for `--minutes`, then with
the node restarted and another SIGSTOPped (paused) for `--minutes`. A step that fails is run again, as Airflow's
retry would, and counted. Prints, per phase: runs, failed steps, the median and the slowest run, the ratio of the
medians to the whole cluster's, and whether both outputs hold every record once; and what the liveness check that
precedes every kafka-python client costs (kafka.liveness.reachable, beside the admin client's own construction),
with the whole cluster and with a node paused. Run it alone: beside other work a run's time says little.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("AIRFLOW_EXACTLY_ONCE_KAFKA_VERSION", "4.4.0")

from airflow_exactly_once.kafka.liveness import reachable  # noqa: E402
from airflow_exactly_once.kafka.settings import KafkaSettings  # noqa: E402
from airflow_exactly_once.sinks.kafka.probe import new_admin_client  # noqa: E402
from devtools.kafka_cluster import LocalKafkaCluster  # noqa: E402
from tests.helpers import produce, read_parquet  # noqa: E402
from tests.kafka_helpers import read_all  # noqa: E402
from tests.worker_tasks import STEPS  # noqa: E402

ATTEMPTS = 3


class Pipeline:
    """One pipeline of the benchmark, its tasks run by worker processes under its own AIRFLOW_HOME."""

    def __init__(self, cluster: LocalKafkaCluster, base: Path, sink: str) -> None:
        self.cluster, self.kind = cluster, sink
        self.name = f"away_{sink}_{uuid.uuid4().hex[:6]}"
        self.source = f"{self.name}-in"
        cluster.create_topic(self.source, partitions=3)
        if sink == "kafka":
            cluster.create_topic(f"{self.name}-out", partitions=2)
            self.sink: dict[str, Any] = {"type": "kafka", "topic": f"{self.name}-out"}
        else:
            self.sink = {"type": "parquet", "path": str(base / self.name / "out")}
        self.home = base / self.name / "home"
        self.home.mkdir(parents=True)
        self.sent: list[str] = []
        self.runs = 0

    def env(self) -> dict[str, str]:
        return {**os.environ, "AIRFLOW_HOME": str(self.home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "PYTHONPATH": str(REPO),
                "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
                    {"conn_type": "kafka", "extra": {"bootstrap.servers": self.cluster.bootstrap_servers}})}

    def _steps(self, steps: tuple[str, ...], run_id: str, batch_id: str | None) -> dict[str, Any]:
        request = {"dag_id": self.name, "pipeline": {"pipeline_id": self.name, "topics": self.source,
                                                     "startup_mode": "earliest", "sink": self.sink},
                   "run_id": run_id, "steps": list(steps), "batch_id": batch_id}
        done = subprocess.run([sys.executable, "-m", "tests.worker_tasks", json.dumps(request)], cwd=REPO,
                              env=self.env(), capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"worker exited {done.returncode}: {done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def run(self, records: int) -> tuple[float, list[str]]:
        """Produce `records`, then one whole run; its seconds and the errors of the steps that had to run again."""
        self.sent += produce(self.cluster.live_bootstrap(), self.source, records, start=len(self.sent))
        self.runs += 1
        run_id, errors = f"manual__{self.runs}", []
        started = time.monotonic()
        report = self._steps(STEPS, run_id, None)
        for _ in range(ATTEMPTS - 1):
            if "error" not in report:
                break
            error = report["error"]
            errors.append(f"{error['step']}: {error['type']}: {error['message'][:300]}")
            report = {**self._steps(STEPS[STEPS.index(error["step"]):], run_id, report["batch_id"]),
                      "batch_id": report["batch_id"]}
        if "error" in report:
            errors.append(f"FAILED FOR GOOD {report['error']}")
        return time.monotonic() - started, errors

    def exact(self) -> str:
        if self.kind == "kafka":
            got = read_all(self.cluster.live_bootstrap(), self.sink["topic"])
        else:
            got = [v.decode() if isinstance(v, bytes) else v
                   for v in (row["value"] for row in read_parquet(Path(self.sink["path"])))]
        counts = Counter(got)
        missing = len(set(self.sent) - set(counts))
        duplicated = sum(c - 1 for c in counts.values() if c > 1)
        verdict = "exact" if not missing and not duplicated and len(got) == len(self.sent) else "NOT EXACT"
        return f"{verdict} ({len(got)} of {len(self.sent)} records, {missing} missing, {duplicated} duplicated)"


def client_costs(cluster: LocalKafkaCluster, repeats: int = 20) -> tuple[float, float]:
    """Median milliseconds of the liveness check over every bootstrap server, and of a whole admin client (the check,
    bootstrap, close) after it."""
    settings = KafkaSettings(cluster.bootstrap_servers)
    checks, clients = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        reachable(settings)
        checks.append(time.perf_counter() - started)
        started = time.perf_counter()
        new_admin_client(settings).close()
        clients.append(time.perf_counter() - started)
    return statistics.median(checks) * 1000, statistics.median(clients) * 1000


def phase(name: str, pipelines: list[Pipeline], records: int, minutes: float | None, runs: int | None) -> dict:
    """Runs alternating between the pipelines, for `minutes` or `runs` runs."""
    times: dict[str, list[float]] = {p.kind: [] for p in pipelines}
    failed: list[str] = []
    deadline = time.monotonic() + minutes * 60 if minutes is not None else None
    count = 0
    while (deadline is not None and time.monotonic() < deadline) or (runs is not None and count < runs):
        pipeline = pipelines[count % len(pipelines)]
        seconds, errors = pipeline.run(records)
        times[pipeline.kind].append(seconds)
        failed += [f"{pipeline.kind} run {pipeline.runs}: {e}" for e in errors]
        print(f"  {name}: {pipeline.kind} run {pipeline.runs} {seconds:.1f} s"
              + (f", {len(errors)} step(s) run again: {errors}" if errors else ""), flush=True)
        count += 1
    return {"times": times, "failed": failed, "load": os.getloadavg()[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long each node stays away")
    parser.add_argument("--records", type=int, default=300, help="records produced before each run")
    parser.add_argument("--baseline-runs", type=int, default=4, help="runs with the whole cluster first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-node-away-") as tmp, LocalKafkaCluster(Path(tmp) / "cluster") as cluster:
        costs = {"whole cluster": client_costs(cluster)}
        pipelines = [Pipeline(cluster, Path(tmp), "kafka"), Pipeline(cluster, Path(tmp), "parquet")]
        results = {"whole cluster": phase("whole cluster", pipelines, args.records, None, args.baseline_runs)}
        killed = cluster.partition_leader(pipelines[0].source, 0)
        cluster.kill(killed)
        results[f"node {killed} killed"] = phase(f"node {killed} killed", pipelines, args.records, args.minutes, None)
        cluster.restart(killed)
        paused = cluster.partition_leader(pipelines[1].source, 0)
        cluster.pause(paused)
        costs[f"node {paused} paused"] = client_costs(cluster)
        results[f"node {paused} paused"] = phase(f"node {paused} paused", pipelines, args.records, args.minutes, None)
        cluster.resume(paused)
        cluster.wait_brokers(len(cluster.nodes))
        verdicts = {p.kind: p.exact() for p in pipelines}
    base = {kind: statistics.median(t) for kind, t in results["whole cluster"]["times"].items()}
    print(f"\nKafka {os.environ['AIRFLOW_EXACTLY_ONCE_KAFKA_VERSION']}, 3 nodes, {args.records} records a run, "
          f"{args.minutes:g} min per node away")
    print(f"{'phase':<18} {'sink':<8} {'runs':>4} {'median s':>9} {'max s':>7} {'vs whole':>8} {'load':>5}")
    for name, result in results.items():
        for kind, times in result["times"].items():
            print(f"{name:<18} {kind:<8} {len(times):>4} {statistics.median(times):>9.1f} {max(times):>7.1f} "
                  f"{statistics.median(times) / base[kind]:>7.2f}x {result['load']:>5.1f}")
    for name, (check_ms, client_ms) in costs.items():
        print(f"liveness check, {name}: median {check_ms:.1f} ms; an admin client with it {client_ms:.1f} ms "
              f"(the check {check_ms / client_ms:.0%} of it)")
    failed = [f for result in results.values() for f in result["failed"]]
    print(f"steps run again: {len(failed)}" + "".join(f"\n  {f}" for f in failed))
    for kind, verdict in verdicts.items():
        print(f"{kind} output: {verdict}")
    return 0 if not failed and all(v.startswith("exact") for v in verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
