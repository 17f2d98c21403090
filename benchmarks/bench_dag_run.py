"""One whole DAG run in a real Airflow: a small exactly-once batch in-process and on Spark Connect, beside
Airflow's own no-op 3-task DAG and the at-least-once DAG a user writes by hand (one task: a local SparkSession
reads the new records, applies the same transform, appends Parquet, stores its offsets), in one run.

Starts a Kafka broker, a Spark Connect server and Airflow (api-server, scheduler,
dag-processor, LocalExecutor) from devtools, with the DAGs of benchmarks/dags/. Each round
produces --records new records and triggers the four DAGs, rotating which goes first; every
run is split into what Airflow's API and the write task's summary say:

* run: the DAG run's start to end, as Airflow records it;
* plan, write, notify_complete: each task instance's start to end (so: task start-up included);
* spark session, job: inside the write task, getting a Spark session and running the job.

Prints every run, the medians, the ratios to the no-op DAG (issue 28's goal for Spark Connect:
at most 1.5x) and of the in-task default to the hand-written DAG (goal: at most 1.1x), and the load average.

    PYTHONPATH=. python benchmarks/bench_dag_run.py                # 100 records a batch, 5 rounds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import uuid
from datetime import datetime
from pathlib import Path

from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from devtools.airflow_stack import AirflowStack
from devtools.kafka_broker import LocalKafkaBroker
from devtools.maven import spark_conf_dir
from devtools.spark_connect import LocalSparkConnectServer

DAGS = ("bench_noop", "bench_local", "bench_connect", "bench_by_hand")
FOLDER = Path(__file__).resolve().parent / "dags"


def seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    return (datetime.fromisoformat(end.replace("Z", "+00:00")) - datetime.fromisoformat(start.replace("Z", "+00:00"))
            ).total_seconds()


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for i in range(count):
        producer.send(topic, key=str(i).encode(), value=f"value-{uuid.uuid4().hex}".encode(), partition=i % 3)
    producer.flush()
    producer.close()


def measure(stack: AirflowStack, dag: str, run_id: str) -> dict:
    stack.trigger(dag, run_id)
    state = stack.wait_run(dag, run_id, timeout=900)
    run = stack.api("GET", f"/dags/{dag}/dagRuns/{run_id}")
    result = {"dag": dag, "state": state, "run": seconds(run["start_date"], run["end_date"])}
    tis = stack.api("GET", f"/dags/{dag}/dagRuns/{run_id}/taskInstances")["task_instances"]
    for ti in tis:
        result[ti["task_id"].rpartition(".")[2]] = seconds(ti["start_date"], ti["end_date"])
    if dag == "bench_by_hand":  # its one task is the write
        result["write"] = result.pop("by_hand")
    if dag != "bench_noop":
        write = next(ti["task_id"] for ti in tis if ti["task_id"].endswith((".write", "by_hand")))
        entry = stack.api("GET", f"/dags/{dag}/dagRuns/{run_id}/taskInstances/{write}/xcomEntries/return_value")
        summary = entry["value"] if isinstance(entry["value"], dict) else json.loads(entry["value"])
        result["spark session"] = summary["seconds"]["spark_session"]
        result["job"] = summary["seconds"]["total"] - summary["seconds"]["spark_session"]
    return result


COLUMNS = ("run", "plan", "write", "notify_complete", "spark session", "job")


def median_table(rows: list[dict], dags: tuple[str, ...]) -> dict[str, dict[str, float | None]]:
    """The medians of each DAG's successful runs (`measure`'s rows) by column, printed as a table, a line per DAG."""
    width = max(len(dag) for dag in dags) + 2
    print(f"{'DAG':<{width}}" + "".join(f"{c:>17}" for c in COLUMNS))
    medians = {}
    for dag in dags:
        mine = [r for r in rows if r["dag"] == dag and r["state"] == "success"]
        medians[dag] = {c: statistics.median(r[c] for r in mine) if mine and mine[0].get(c) is not None else None
                        for c in COLUMNS}
        print(f"{dag:<{width}}" + "".join(f"{'-' if v is None else f'{v:.2f}':>17}" for v in medians[dag].values()))
    return medians


def round_arguments(doc: str | None) -> argparse.Namespace:
    """--records (per batch) and --rounds, the command line of the DAG-run benchmarks (`doc`: the script's help)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100, help="records per batch")
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args()


def main() -> None:
    args = round_arguments(__doc__)

    work = Path(tempfile.mkdtemp(prefix="bench-dag-run-"))
    load_before = os.getloadavg()
    broker = LocalKafkaBroker(work / "kafka").start()
    connect = stack = None
    try:
        connect = LocalSparkConnectServer(work / "spark-connect").start()
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        admin.create_topics([NewTopic("bench", 3, 1)])
        admin.close()
        env = {
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka",
                                                      "extra": {"bootstrap.servers": broker.bootstrap_servers}}),
            "AIRFLOW_CONN_BENCH_SPARK_CONNECT": json.dumps(connect.connection()),
            "BENCH_TOPIC": "bench", "BENCH_OUTPUT": str(work / "output"), "BENCH_BOOTSTRAP": broker.bootstrap_servers,
            "SPARK_CONF_DIR": str(spark_conf_dir(work / "spark-conf")),
            "PYTHONPATH": str(work / "airflow" / "dags"),  # bench_transforms, as a DAG folder module
        }
        stack = AirflowStack(work / "airflow", sorted(FOLDER.glob("*.py")), env).start()
        for dag in DAGS:
            stack.wait_for_dag(dag)
        rows = []
        for n in range(args.rounds + 1):  # round 0 warms up (first imports, the server's first job)
            produce(broker.bootstrap_servers, "bench", args.records)
            for dag in DAGS[n % len(DAGS):] + DAGS[:n % len(DAGS)]:
                result = measure(stack, dag, f"{dag}-{n}")
                print(f"round {n} {json.dumps(result)}", flush=True)
                if n:
                    rows.append(result)
    finally:
        if stack is not None:
            stack.stop()
        if connect is not None:
            connect.stop()
        broker.stop()
    load_after = os.getloadavg()

    print(f"\nmedians of {args.rounds} rounds (seconds), {args.records} records a batch; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after:")
    medians = median_table(rows, DAGS)
    noop, by_hand = medians["bench_noop"]["run"], medians["bench_by_hand"]["run"]
    for dag in ("bench_local", "bench_connect", "bench_by_hand"):
        print(f"{dag} run / no-op run: {medians[dag]['run'] / noop:.2f}x")
    print(f"bench_local run / bench_by_hand run (the default path against writing it by hand): "
          f"{medians['bench_local']['run'] / by_hand:.2f}x")
    print(json.dumps({"medians": medians, "load": [load_before, load_after], "rows": rows}))


if __name__ == "__main__":
    main()
