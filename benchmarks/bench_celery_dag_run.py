"""One DAG run on two Celery workers against the same DAG run on the LocalExecutor, side by side in one run.

Issue 47's goal: a small exactly-once batch whose write runs on a warm Spark Connect server takes at most 1.2x as
long on two Celery workers (plan and notify_complete on worker A, write on worker B: every hand-over crosses
workers and the broker) as on the LocalExecutor; routing must not add a queue's worth of waiting per task.

One Airflow (devtools.airflow_stack) runs both executors (`[core] executor = LocalExecutor,CeleryExecutor`; each
DAG's tasks name theirs), so both DAGs share the scheduler, api-server, metadata database (PostgreSQL, also Celery's
result backend), Kafka broker, Spark Connect server and ledger (PostgreSQL); the Celery workers use Redis from
Debian as their broker. Each round produces --records new records and triggers both DAGs, alternating which goes
first; each run is split as benchmarks/bench_dag_run.py splits it (its `measure`). Prints every run, the medians,
the ratio, and the load average before and after.

    PYTHONPATH=. python benchmarks/bench_celery_dag_run.py            # 100 records a batch, 5 rounds
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from bench_dag_run import measure, median_table, produce, round_arguments
from kafka.admin import KafkaAdminClient, NewTopic

from devtools.airflow_stack import METADATA_DATABASE, AirflowStack, CeleryWorkers, metadata_server
from devtools.kafka_broker import LocalKafkaBroker
from devtools.maven import spark_conf_dir
from devtools.redis import LocalRedis
from devtools.spark_connect import LocalSparkConnectServer

DAGS = ("bench_on_local", "bench_on_celery")
FOLDER = Path(__file__).resolve().parent / "dags"
TOPIC = "bench"
GOAL = 1.2  # the Celery run's median over the LocalExecutor's, at most


def main() -> None:
    args = round_arguments(__doc__)

    work = Path(tempfile.mkdtemp(prefix="bench-celery-dag-run-"))
    load_before = os.getloadavg()
    started = []  # servers, stopped in reverse order
    try:
        broker = LocalKafkaBroker(work / "kafka").start()
        started.append(broker)
        database = metadata_server(work / "postgres")  # Airflow's metadata (and Celery's results) and the ledger
        started.append(database)
        redis = LocalRedis(work / "redis").start()
        started.append(redis)
        connect = LocalSparkConnectServer(work / "spark-connect").start()
        started.append(connect)
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        admin.create_topics([NewTopic(name, 3, 1) for name in (TOPIC, *(f"{TOPIC}-{dag}" for dag in DAGS))])
        admin.close()
        env = {
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka",
                                                      "extra": {"bootstrap.servers": broker.bootstrap_servers}}),
            "AIRFLOW_CONN_BENCH_SPARK_CONNECT": json.dumps(connect.connection()),
            "AIRFLOW_CONN_BENCH_LEDGER": json.dumps({"conn_type": "exactly_once_ledger",
                                                     "host": database.create_database("ledger")}),
            "BENCH_TOPIC": TOPIC,
            "SPARK_CONF_DIR": str(spark_conf_dir(work / "spark-conf")),
            "PYTHONPATH": str(work / "airflow" / "dags"),  # bench_transforms, as a DAG folder module
        }
        stack = AirflowStack(work / "airflow", [FOLDER / "bench_celery_dags.py", FOLDER / "bench_transforms.py"],
                             env, database_url=database.url(METADATA_DATABASE), executor="LocalExecutor,CeleryExecutor",
                             celery=CeleryWorkers(redis.url(), {"a": ("bench_a",), "b": ("bench_b",)}))
        started.append(stack.start())
        for dag in DAGS:
            stack.wait_for_dag(dag)
        rows = []
        for n in range(args.rounds + 1):  # round 0 warms up (first imports, the server's first job)
            produce(broker.bootstrap_servers, TOPIC, args.records)
            for dag in DAGS[n % 2:] + DAGS[:n % 2]:
                result = measure(stack, dag, f"{dag}-{n}")
                print(f"round {n} {json.dumps(result)}", flush=True)
                if n:
                    rows.append(result)
    finally:
        for server in reversed(started):
            server.stop()
    load_after = os.getloadavg()

    print(f"\nmedians of {args.rounds} rounds (seconds), {args.records} records a batch; load average (1, 5, 15 min) "
          f"{', '.join(f'{v:.1f}' for v in load_before)} before, {', '.join(f'{v:.1f}' for v in load_after)} after:")
    medians = median_table(rows, DAGS)
    ratio = medians["bench_on_celery"]["run"] / medians["bench_on_local"]["run"]
    print(f"bench_on_celery run / bench_on_local run: {ratio:.2f}x (goal: at most {GOAL}x) "
          f"{'MET' if ratio <= GOAL else 'MISSED'}")
    print(json.dumps({"medians": medians, "ratio": ratio, "load": [load_before, load_after], "rows": rows}))


if __name__ == "__main__":
    main()
