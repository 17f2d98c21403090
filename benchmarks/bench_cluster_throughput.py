"""Records per second of one 1,000,000-record batch: local mode vs a standalone cluster, 1 and 2 executors.

    python benchmarks/bench_cluster_throughput.py [--records 1000000] [--repeat 3] [--partitions 4]

Starts its own Kafka broker and Spark standalone cluster (devenv, 127.0.0.1), produces the
records once, then for each mode and repetition plans a new pipeline over the same range
and runs the real write task (WriteBatchOperator.execute): in-process `local[2]`, or
spark-submitted with `spark.cores.max` = 1 or 2 one-core executors. Timings come from the
wall clock of the task and from Spark's event log:
  * job records/s = records / (first task launched -> last task finished), the data path only;
  * task records/s = records / whole write task, fixed costs included;
  * fixed cost = write task start -> first executor task launched (JVM, application,
    executors, Kafka offsets: everything before the first record is read).
Prints one JSON line per run and a table of medians.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devtools.kafka_broker import LocalKafkaBroker  # noqa: E402
from devtools.spark_cluster import APP_CONF, WORKER_CORES, LocalSparkCluster  # noqa: E402
from devtools.maven import use_prefetched_connector

SPARK_CONN_ID = "bench_spark"
MODES = {
    "local[2]": None,
    "cluster, 1 executor": "1",
    "cluster, 2 executors": "2",
}


def produce(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20, batch_size=512 * 1024)
    for i in range(records):
        producer.send(topic, key=str(i).encode(), value=f'{{"id": {i}, "name": "item-{i}"}}'.encode(),
                      partition=i % partitions)
    producer.flush()
    producer.close()


def event_times(event_dir: Path) -> dict[str, float]:
    """First task launch and last task end (epoch seconds) from the run's event log (one application)."""
    launches, finishes = [], []
    lines = [line for log in sorted(event_dir.rglob("*")) if log.is_file() for line in log.read_text().splitlines()]
    for line in lines:
        event = json.loads(line)
        if event["Event"] == "SparkListenerTaskStart":
            launches.append(event["Task Info"]["Launch Time"])
        elif event["Event"] == "SparkListenerTaskEnd":
            finishes.append(event["Task Info"]["Finish Time"])
    return {"first_task": min(launches) / 1000, "last_task_end": max(finishes) / 1000, "tasks": len(launches)}


def run_once(mode: str, cores_max: str | None, n: int, args, bootstrap: str, work: Path) -> dict:
    from airflow_exactly_once.operators.batch import PlanBatchOperator, WriteBatchOperator

    pipeline = f"bench-{n}-{'local' if cores_max is None else f'cluster{cores_max}'}"
    events = work / "events" / pipeline
    events.mkdir(parents=True)
    spark_conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": f"file://{events}",
                  "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}
    if cores_max is None:
        spark_conf.update({"spark.master": f"local[{WORKER_CORES}]", "spark.driver.memory": "1g"})
        spark_conn_id = None
    else:
        spark_conf.update({**APP_CONF, "spark.cores.max": cores_max})
        spark_conn_id = SPARK_CONN_ID
    common = dict(pipeline_id=pipeline, topics=args.topic, bootstrap_servers=bootstrap,
                  ledger_url=f"sqlite:///{work / 'ledger.db'}", sink={"type": "parquet", "path": str(work / pipeline)},
                  spark_conf=spark_conf, spark_conn_id=spark_conn_id)
    batch_id = PlanBatchOperator(task_id="plan", **common).execute({"run_id": pipeline})
    write = WriteBatchOperator(task_id="write", batch_id=batch_id, **common)
    start = time.time()
    summary = write.execute({"run_id": pipeline})
    end = time.time()
    times = event_times(events)
    records = summary["input_records"]
    assert records == args.records, summary
    result = {
        "mode": mode, "run": n, "records": records, "tasks": times["tasks"],
        "task_seconds": round(end - start, 2),
        "job_seconds": round(times["last_task_end"] - times["first_task"], 2),
        "fixed_cost_seconds": round(times["first_task"] - start, 2),
    }
    result["job_records_per_s"] = round(records / result["job_seconds"])
    result["task_records_per_s"] = round(records / result["task_seconds"])
    shutil.rmtree(work / pipeline, ignore_errors=True)
    return result


def main() -> int:
    use_prefetched_connector()  # the Kafka connector jars fetched by `make setup`
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--topic", default="bench")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="eo-bench-cluster-"))
    os.environ.setdefault("AIRFLOW_HOME", str(work / "airflow-home"))
    broker = LocalKafkaBroker(work / "kafka").start()
    cluster = LocalSparkCluster(work / "spark").start()
    try:
        os.environ[f"AIRFLOW_CONN_{SPARK_CONN_ID.upper()}"] = json.dumps(cluster.connection("client"))
        started = time.time()
        produce(broker.bootstrap_servers, args.topic, args.records, args.partitions)
        print(f"produced {args.records} records in {time.time() - started:.1f}s", file=sys.stderr)
        results = []
        spawn = multiprocessing.get_context("spawn")  # a fresh interpreter (and JVM) per run, as a task has
        for n in range(args.repeat):  # interleaved, so that load from elsewhere hits every mode alike
            for mode, cores_max in MODES.items():
                with spawn.Pool(1) as pool:
                    result = pool.apply(run_once, (mode, cores_max, n, args, broker.bootstrap_servers, work))
                print(json.dumps(result), flush=True)
                results.append(result)
        print(f"\nmedians of {args.repeat} runs, {args.records} records in {args.partitions} partitions, "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores:")
        print(f"{'mode':24} {'job rec/s':>10} {'task rec/s':>11} {'job s':>7} {'task s':>7} {'fixed cost s':>13}")
        for mode in MODES:
            rows = [r for r in results if r["mode"] == mode]
            med = {k: statistics.median(r[k] for r in rows) for k in
                   ("job_records_per_s", "task_records_per_s", "job_seconds", "task_seconds", "fixed_cost_seconds")}
            print(f"{mode:24} {med['job_records_per_s']:>10.0f} {med['task_records_per_s']:>11.0f} "
                  f"{med['job_seconds']:>7.1f} {med['task_seconds']:>7.1f} {med['fixed_cost_seconds']:>13.1f}")
    finally:
        cluster.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
