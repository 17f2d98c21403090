"""Small helpers shared by the tests: topics, producing, reading output back, the ledger."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import UnknownTopicOrPartitionError

from airflow_exactly_once.core.ledger import Ledger


def client_args(cluster: str | dict[str, Any]) -> dict[str, Any]:
    """kafka-python keyword arguments for a cluster given as servers or as ready arguments."""
    return {"bootstrap_servers": cluster} if isinstance(cluster, str) else dict(cluster)


def create_topic(bootstrap: str | dict[str, Any], topic: str, partitions: int = 3, timeout_s: float = 30.0) -> None:
    """Create `topic` and return once its partitions show in the cluster's metadata (creation is asynchronous:
    a client asking right after could be told the topic does not exist)."""
    admin = KafkaAdminClient(**client_args(bootstrap))
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
        deadline = time.monotonic() + timeout_s
        while len(_described_partitions(admin, topic)) < partitions:
            assert time.monotonic() < deadline, f"topic {topic} never showed its {partitions} partitions"
            time.sleep(0.1)
    finally:
        admin.close()


def _described_partitions(admin: KafkaAdminClient, topic: str) -> list:
    try:
        return admin.describe_topics([topic])[0].get("partitions") or []
    except UnknownTopicOrPartitionError:
        return []


def produce(bootstrap: str | dict[str, Any], topic: str, count: int, partitions: int = 3, start: int = 0,
            json_values: bool = False) -> list[str]:
    """Send `count` records round-robin over partitions; returns the values sent."""
    producer = KafkaProducer(**client_args(bootstrap), acks="all")
    values = []
    for i in range(start, start + count):
        value = json.dumps({"id": i, "name": f"item-{i}", "amount": i * 0.5}) if json_values else f"value-{i}"
        producer.send(topic, key=str(i).encode(), value=value.encode(), partition=i % partitions)
        values.append(value)
    producer.flush()
    producer.close()
    return values


def read_topic(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[str]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False,
                             consumer_timeout_ms=3000)
    tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    values = [m.value.decode() for m in consumer]
    consumer.close()
    return values


def read_parquet(path: Path) -> list[dict]:
    """What any Parquet reader sees (pyarrow, like Spark, ignores `_`-prefixed folders)."""
    import pyarrow.dataset as ds

    if not Path(path).exists():
        return []
    return ds.dataset(str(path), format="parquet", partitioning="hive").to_table().to_pylist()


def assert_exactly_once(sent: list[str], got: list[str]) -> None:
    counts = Counter(got)
    duplicates = {v: c for v, c in counts.items() if c > 1}
    missing = set(sent) - set(counts)
    unexpected = set(counts) - set(sent)
    assert not duplicates, f"{len(duplicates)} duplicated records, e.g. {list(duplicates.items())[:3]}"
    assert not missing, f"{len(missing)} missing records, e.g. {sorted(missing)[:3]}"
    assert not unexpected, f"{len(unexpected)} unexpected records, e.g. {sorted(unexpected)[:3]}"
    assert len(got) == len(sent)


def assert_ranges_tile(ledger: Ledger, pipeline_id: str) -> None:
    """Committed ranges of each partition follow each other with no gap and no overlap
    (recorded rewinds and accepted data loss aside): observe.audit's check."""
    from airflow_exactly_once.observe.audit import audit_pipeline

    report = audit_pipeline(ledger, pipeline_id)
    assert report.ok, report.problems


def read_s3_parquet(client: Any, bucket: str, prefix: str) -> list[dict]:
    """What a reader listing an object-storage folder sees: every Parquet object under `prefix`, but those under
    `_`-prefixed folders (the manifest, dead letters), as pyarrow's and Spark's readers skip them."""
    import io

    import pyarrow.parquet as pq

    rows: list[dict] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            below = item["Key"][len(prefix):].lstrip("/")
            if not below.endswith(".parquet") or any(p.startswith(("_", ".")) for p in below.split("/")):
                continue
            body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            rows += pq.read_table(io.BytesIO(body)).to_pylist()
    return rows


def s3_open_uploads(client: Any, bucket: str, prefix: str) -> list[str]:
    """The keys of the multipart uploads still open under `prefix`."""
    return sorted(u["Key"] for u in client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", []))


def staging_leftovers(output: Path) -> list[Path]:
    staging = Path(output) / "_staging"
    return list(staging.iterdir()) if staging.exists() else []


def iceberg_staged(committer: Any) -> list[Any]:
    """An Iceberg table's staged leftovers (an Iceberg sink's TableCommitter): snapshots outside main's history,
    and refs other than main."""
    table = committer.load()
    main = {s.snapshot_id for s in committer.main_history(table)}
    return [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id not in main] + sorted(
        set(table.metadata.refs) - {"main"})


def pg_query(dsn: str, statement: str, params=()) -> list[tuple]:
    """One autocommit statement on PostgreSQL; its rows (or [] when it returns none)."""
    import psycopg2

    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(statement, params)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def values_of(output: Path) -> list[str]:
    """The `v` column of a Parquet output (what the test DAGs write)."""
    return [row["v"] for row in read_parquet(output)]


def wait_for(predicate, what: str, timeout: float = 300.0, poll: float = 0.3, stack=None):
    """Poll `predicate` until it returns something truthy (returned), or fail naming `what`; with an AirflowStack
    `stack`, fail at once when one of its components died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stack is not None:
            stack._check_alive()
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


class HangUpListener:
    """A TCP port on 127.0.0.1 that accepts each connection and closes it at once, counting them.

    A client that keeps retrying against it is observable: each attempt is one more count (the backlog
    trigger's test sees its polls go on this way, instead of sleeping and hoping)."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, name=f"hang-up-{self.port}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._socket.accept()
            except OSError:
                return  # closed
            self.connections += 1
            client.close()

    def close(self) -> None:
        self._socket.close()


class StatsdListener:
    """A StatsD server on 127.0.0.1 (UDP) that keeps the metrics whose names start with `keep`, in arrival order.

    Airflow's StatsD logger sends one datagram per value, "name:value|type" (a negative gauge as two lines);
    each is kept as (name, value, type). What does not start with `keep` (Airflow's own scheduler metrics) is
    dropped on arrival, so the session's stack can send here all along at no cost to the tests."""

    def __init__(self, keep: str = "", limit: int = 200_000) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        self.keep = keep
        self.limit = limit
        self.metrics: list[tuple[str, float, str]] = []
        threading.Thread(target=self._serve, name=f"statsd-{self.port}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                data = self._socket.recv(65_535)
            except OSError:
                return  # closed
            for line in data.decode(errors="replace").splitlines():
                name, _, rest = line.partition(":")
                value, _, kind = rest.partition("|")
                if name.startswith(self.keep) and len(self.metrics) < self.limit:
                    self.metrics.append((name, float(value), kind.partition("|")[0]))

    def values(self, name: str, kind: str | None = None) -> list[float]:
        """Every value received under exactly `name` (and of `kind`: c, g, ms), oldest first."""
        return [v for n, v, k in list(self.metrics) if n == name and (kind is None or k == kind)]

    def names(self, start: str) -> set[str]:
        return {n for n, _, _ in list(self.metrics) if n.startswith(start)}

    def close(self) -> None:
        self._socket.close()
