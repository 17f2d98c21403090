"""`make demo`: a local Kafka, a real Airflow, the example DAG, a crash, and a verification line; then the same
input into Parquet on a local S3-compatible server (s3proxy), with its own verification line.

    python -m devtools.demo [--records 3000] [--bad-records 6] [--keep] [--spark-connect] [--no-s3]

The input mixes good JSON events with a few bad ones (not JSON, a field of the wrong type); the
example DAG decodes values strictly and sends bad records to `<output>/_dead_letter`, so the
verification line counts both: every record lands exactly once, in the output or as a dead letter.

s3proxy starts beside Kafka (in a thread, so the demo's start-up waits for it only if it is slower than Kafka,
PostgreSQL and Airflow together); the Airflow connection `aws_default` (type `aws`) points at it, and
dags/kafka_to_parquet_s3.py writes to its bucket `lake`. The S3 check reads only what `_manifest/` lists: what a
reader that wants whole batches reads (docs/sinks/parquet.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from airflow_exactly_once.core.faults import ENV as FAULTS_ENV, arm
from devtools.airflow_stack import METADATA_DATABASE, AirflowStack, metadata_server
from devtools.kafka_broker import LocalKafkaBroker
from devtools.maven import spark_conf_dir
from devtools.object_storage import LocalObjectStorage, committed_rows
from devtools.spark_connect import LocalSparkConnectServer

REPO = Path(__file__).resolve().parents[1]
DAG_ID = "kafka_to_parquet"
S3_DAG_ID = "kafka_to_parquet_s3"
S3_BUCKET = "lake"
TOPIC = "events"


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def bad_value(n: int) -> bytes:
    """The n-th bad record's value: alternately not JSON at all, and JSON with a field of the wrong type."""
    return b"{not json" if n % 2 == 0 else json.dumps({"id": f"bad-{n}", "name": "x", "amount": 1}).encode()


def close_kafka_clients(*clients: Any) -> None:
    """Close kafka-python clients the demo is done with, one after the other, without the ERROR lines kafka-python
    logs about its own close.

    Closing a client fails the requests it still has in flight. When one is a metadata refresh (its IO thread sends
    one on a timer, or soon after the consumer asked for fresh metadata), `kafka.cluster` logs "Metadata refresh:
    failed Cancelled" at ERROR (the consumer's fetcher logs the same cancel at INFO), and when the close lands while
    the request is on the wire, `kafka.net` adds "Connection lost" and "Abort" of the connection the close itself
    shut. kafka-python's close ends its connections before its refresh loop. Nothing failed: the producer has
    flushed, the consumer has read up to the end offsets and the admin's topic exists before their close. So only
    while closing, and only kafka-python's loggers, are held to CRITICAL.
    """
    logger = logging.getLogger("kafka")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        for client in clients:
            client.close()
    finally:
        logger.setLevel(level)


def produce_events(bootstrap: str, count: int, bad: int, partitions: int) -> None:
    """`count` good events (ids 0..count-1) with `bad` bad records spread among them."""
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])
    close_kafka_clients(admin)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    every = max(1, count // (bad + 1))
    sent_bad = 0
    for i in range(count):
        value = {"id": i, "name": f"item-{i}", "amount": round(i * 0.25, 2)}
        producer.send(TOPIC, key=str(i).encode(), value=json.dumps(value).encode(), partition=i % partitions)
        if sent_bad < bad and (i + 1) % every == 0:
            producer.send(TOPIC, key=f"bad-{sent_bad}".encode(), value=bad_value(sent_bad), partition=i % partitions)
            sent_bad += 1
    producer.flush()
    close_kafka_clients(producer)


def read_input(bootstrap: str) -> tuple[Counter, Counter]:
    """What the input topic holds under read_committed, counted from the topic itself (not from what was sent):
    the ids of the good events, and the keys of the bad records (values that do not decode as an event)."""
    from kafka import KafkaConsumer, TopicPartition

    logging.getLogger("kafka").setLevel(logging.WARNING)  # Airflow's logging, set up by now, would print its info
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False,
                             consumer_timeout_ms=10_000)
    partitions = [TopicPartition(TOPIC, p) for p in sorted(consumer.partitions_for_topic(TOPIC) or ())]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    ends = consumer.end_offsets(partitions)
    good: Counter = Counter()
    bad: Counter = Counter()
    try:
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            for records in consumer.poll(timeout_ms=1000).values():
                for record in records:
                    event = _event(record.value)
                    if event is None:
                        bad[record.key] += 1
                    else:
                        good[event["id"]] += 1
    finally:
        close_kafka_clients(consumer)
    return good, bad


def _event(value: bytes) -> dict | None:
    """An event as the example DAG's schema reads it (an integer id), or None for a bad record."""
    try:
        event = json.loads(value)
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("id"), int) else None


def verify(output: Path, good_in: Counter, bad_in: Counter) -> tuple[str, bool]:
    """Every good event of the input once in the output, every bad record once among the dead letters."""
    import pyarrow.dataset as ds

    # The dataset skips `_dead_letter`, `_manifest` and `_staging` (names starting with "_").
    ids = ds.dataset(str(output), format="parquet", partitioning="hive").to_table(columns=["id"]).column("id")
    dead_folder = output / "_dead_letter"
    dead_keys = (ds.dataset(str(dead_folder), format="parquet", partitioning="hive").to_table(columns=["key"])
                 .column("key").to_pylist() if dead_folder.exists() else [])
    return check_line("exactly-once check", Counter(ids.to_pylist()), Counter(dead_keys), good_in, bad_in)


def check_line(title: str, counts: Counter, dead: Counter, good_in: Counter, bad_in: Counter) -> tuple[str, bool]:
    """The verification line of an output (`counts` of ids, `dead` letters by key) and whether it holds the input
    exactly once."""
    duplicates = sum(max(0, c - good_in[i]) for i, c in counts.items()) + sum(max(0, c - bad_in[k])
                                                                            for k, c in dead.items())
    missing = sum(max(0, c - counts[i]) for i, c in good_in.items()) + sum(max(0, c - dead[k])
                                                                         for k, c in bad_in.items())
    line = (f"{title}: in={sum(good_in.values()) + sum(bad_in.values())} out={sum(counts.values())} "
            f"dead_letters={sum(dead.values())} duplicates={duplicates} missing={missing}")
    return line, counts == good_in and dead == bad_in


def start_object_storage(folder: Path) -> LocalObjectStorage:
    """s3proxy with the demo's bucket."""
    storage = LocalObjectStorage(folder).start()
    storage.create_bucket(S3_BUCKET)
    return storage


def verify_s3(storage: LocalObjectStorage, prefix: str, good_in: Counter, bad_in: Counter) -> tuple[str, bool]:
    """The S3 output, read through its manifests: every good event once, every bad record once as a dead letter."""
    client = storage.client()
    ids = Counter(row["id"] for row in committed_rows(client, S3_BUCKET, prefix, ["id"]))
    dead = Counter(row["key"] for row in committed_rows(client, S3_BUCKET, f"{prefix}/_dead_letter", ["key"]))
    return check_line(f"exactly-once check (s3://{S3_BUCKET}/{prefix}, read through _manifest/)", ids, dead, good_in,
                      bad_in)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.demo")
    parser.add_argument("--records", type=int, default=3000, help="good JSON events")
    parser.add_argument("--bad-records", type=int, default=6,
                        help="malformed records among them (they become dead letters)")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--max-records-per-partition", type=int, default=400)
    parser.add_argument("--workdir", default=None,
                        help="where the broker, Airflow and the output live (default: a new temporary folder, "
                             "so runs never share or depend on leftovers; an existing folder is emptied first)")
    parser.add_argument("--keep", action="store_true",
                        help="leave Kafka and Airflow (and its PostgreSQL) running at the end")
    parser.add_argument("--spark-connect", action="store_true",
                        help="write on a Spark Connect server (started here) instead of a Spark driver per task")
    parser.add_argument("--no-s3", action="store_true",
                        help="no s3proxy and no run of the Parquet-on-S3 example (dags/kafka_to_parquet_s3.py)")
    args = parser.parse_args(argv)
    demo_started = time.monotonic()

    if args.workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="airflow-exactly-once-demo-"))
    else:
        workdir = Path(args.workdir)
        shutil.rmtree(workdir, ignore_errors=True)
    output = workdir / "output" / DAG_ID
    faults = workdir / "faults"
    faults.mkdir(parents=True)

    # s3proxy's JVM starts while Kafka's does (the demo waits for it just before Airflow starts)
    starting_storage: Future | None = None
    if not args.no_s3:
        say(f"starting an S3-compatible server (s3proxy) in {workdir / 's3'}")
        starting_storage = ThreadPoolExecutor(1).submit(start_object_storage, workdir / "s3")
    say(f"starting a Kafka broker (KRaft) in {workdir / 'kafka'}")
    broker = LocalKafkaBroker(workdir / "kafka").start()
    stack = connect = metadata = storage = None
    try:
        if args.spark_connect:
            say("starting a Spark Connect server (local mode, with Spark's Kafka connector)")
            connect = LocalSparkConnectServer(workdir / "spark-connect").start()
        say(f"producing {args.records} JSON events and {args.bad_records} malformed records to topic '{TOPIC}' "
            f"({args.partitions} partitions)")
        produce_events(broker.bootstrap_servers, args.records, args.bad_records, args.partitions)
        env = {
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
                {"conn_type": "kafka", "extra": {"bootstrap.servers": broker.bootstrap_servers}}),
            "EXACTLY_ONCE_DEMO_TOPIC": TOPIC,
            "EXACTLY_ONCE_DEMO_OUTPUT": str(output),
            "EXACTLY_ONCE_DEMO_MAX_RECORDS": str(args.max_records_per_partition),
            FAULTS_ENV: str(faults),
            # The Kafka connector jars fetched by `make setup`, as a Spark user passes jars.
            "SPARK_CONF_DIR": str(spark_conf_dir(workdir / "spark-conf")),
        }
        if connect is not None:  # the example DAG's spark_conn_id: a spark_connect connection
            env["AIRFLOW_CONN_SPARK_CONNECT_DEMO"] = json.dumps(connect.connection())
            env["EXACTLY_ONCE_DEMO_SPARK_CONN_ID"] = "spark_connect_demo"
        if starting_storage is not None:
            storage = starting_storage.result()
            # Airflow's `aws` connection: login = access key id, password = secret key, extra endpoint_url/region
            env["AIRFLOW_CONN_AWS_DEFAULT"] = json.dumps(storage.connection())
            env["EXACTLY_ONCE_DEMO_S3_PATH"] = f"s3://{S3_BUCKET}/{S3_DAG_ID}"
            say(f"s3proxy answers on {storage.endpoint_url} (bucket '{S3_BUCKET}'; Airflow connection 'aws_default')")
        # Airflow's metadata in PostgreSQL (a backfill or clear made in the UI must not meet SQLite's lock)
        say("starting PostgreSQL for Airflow's metadata")
        metadata = metadata_server(workdir / "airflow-metadata")
        say("starting Airflow (api-server, scheduler, dag-processor, triggerer; LocalExecutor)")
        stack = AirflowStack(workdir, sorted((REPO / "dags").glob("*.py")), env,
                             database_url=metadata.url(METADATA_DATABASE), triggerer=True).start()
        stack.wait_for_dag(DAG_ID)
        say(f"Airflow UI: {stack.base_url}  (DAG '{DAG_ID}'; every server up {time.monotonic() - demo_started:.0f}s "
            "after the demo started)")

        per_batch = args.max_records_per_partition * args.partitions
        runs = -(-(args.records + args.bad_records) // per_batch) + 1  # one more run than batches: it finds nothing new
        for n in range(1, runs + 1):
            if n == 2:
                arm(faults, "write.after_stage", "kill", 1)
                say("run 2: the write task will be killed (SIGKILL) right after it staged its output")
            started = time.monotonic()
            state = stack.run(DAG_ID, f"demo_run_{n}")
            tasks = stack.task_states(DAG_ID, f"demo_run_{n}")
            summary = ", ".join(f"{task}={st}{f' (try {tries})' if tries > 1 else ''}"
                                for task, (st, tries) in sorted(tasks.items()))
            say(f"run {n}: {state} in {time.monotonic() - started:.0f}s  [{summary}]")
            if state != "success":
                say(f"run {n} failed; task logs are under {stack.home / 'logs'}")
                return 1

        from airflow_exactly_once.core.ledger import Ledger
        from airflow_exactly_once.hooks.ledger import EMBEDDED_LEDGER_FILE

        ledger = Ledger(f"sqlite:///{stack.home / EMBEDDED_LEDGER_FILE}")
        for batch in ledger.list_batches(DAG_ID, newest_first=False):
            bad = (batch.details.get("bad_records") or {}).get("count", 0)
            say(f"ledger: {batch.describe()} in={batch.input_records} out={batch.output_records} bad={bad}")
        say(f"dead letters (source offset, what was wrong, raw value) are in {output / '_dead_letter'}")
        good_in, bad_in = read_input(broker.bootstrap_servers)
        line, ok = verify(output, good_in, bad_in)
        print(line, flush=True)
        if storage is None or not ok:
            return 0 if ok else 1
        # The same input into Parquet on S3: one run, one batch (its max_records_per_partition takes the topic).
        started = time.monotonic()
        state = stack.run(S3_DAG_ID, "demo_s3_run_1")
        say(f"{S3_DAG_ID} run 1: {state} in {time.monotonic() - started:.0f}s (DAG '{S3_DAG_ID}', "
            f"objects under s3://{S3_BUCKET}/{S3_DAG_ID}/ at {storage.endpoint_url})")
        if state != "success":
            say(f"the S3 run failed; task logs are under {stack.home / 'logs'}")
            return 1
        line, ok = verify_s3(storage, S3_DAG_ID, good_in, bad_in)
        print(line, flush=True)
        return 0 if ok else 1
    finally:
        if not args.keep:
            if stack is not None:
                stack.stop()
            if metadata is not None:
                metadata.stop()
            if connect is not None:
                connect.stop()
            if starting_storage is not None and storage is None:  # failed before it was waited for
                storage = _started_or_none(starting_storage)
            if storage is not None:
                storage.stop()
            broker.stop()
        else:
            say("--keep: Kafka, Airflow and its PostgreSQL (and s3proxy) are left running")


def _started_or_none(starting: Future) -> LocalObjectStorage | None:
    """The server a start-up thread made, or None when it failed (its error was not the demo's)."""
    try:
        return starting.result()
    except Exception:  # noqa: BLE001 - the demo is ending on another error already
        return None


if __name__ == "__main__":
    sys.exit(main())
