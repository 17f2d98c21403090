"""The dev tooling's own pieces that used to make CI fail by chance: cluster ids and ports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from devtools import kafka_broker, ports


def test_cluster_ids_never_look_like_an_option():
    """The storage tool read an id beginning with '-' as an option (one draw in 64)."""
    for _ in range(20_000):
        drawn = kafka_broker.cluster_id()
        assert len(drawn) == 22 and not drawn.startswith("-"), drawn
        args = kafka_broker.format_arguments(Path("/x/server.properties"), drawn)
        assert args == ["format", f"--cluster-id={drawn}", "--config", "/x/server.properties"]


def test_a_dash_first_draw_is_drawn_again(monkeypatch):
    draws = iter([b"\xf8" + bytes(15), bytes(range(16))])  # base64url of 0xf8... begins with '-'
    monkeypatch.setattr(kafka_broker.os, "urandom", lambda n: next(draws))
    assert kafka_broker.cluster_id() == "AAECAwQFBgcICQoLDA0ODw"


def test_reserved_ports_are_outside_the_ephemeral_range_and_exclusive():
    low, high = ports._ephemeral_range()
    reserved = [ports.reserve_port() for _ in range(20)]
    try:
        assert len(set(reserved)) == 20
        assert all(not low <= port <= high for port in reserved)
        # Another process (a parallel test session) cannot take a port this one holds.
        probe = (f"import fcntl, os; fd = os.open({str(ports.LOCK_DIR / f'{reserved[0]}.lock')!r}, os.O_RDWR)\n"
                 "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('taken')\n"
                 "except OSError:\n    print('held')")
        answer = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        assert answer.stdout.strip() == "held"
    finally:
        for port in reserved:
            ports.release_port(port)


def test_the_broker_release_comes_from_the_environment_with_its_logging(monkeypatch):
    from devtools import maven

    monkeypatch.delenv(maven.KAFKA_VERSION_ENV, raising=False)
    assert maven.kafka_version() == "3.9.1"
    monkeypatch.setenv(maven.KAFKA_VERSION_ENV, " 4.4.0 ")
    assert maven.kafka_version() == "4.4.0"
    kafka4 = maven.kafka_broker_artifacts("4.4.0")
    assert [(a.name, a.version) for a in kafka4] == [("kafka_2.13", "4.4.0"), ("log4j-slf4j-impl", "2.25.5")]
    assert [a.name for a in maven.kafka_broker_artifacts("3.9.1")] == ["kafka_2.13", "slf4j-reload4j"]
    for wrong in ("2.8.2", "latest"):
        try:
            maven.kafka_broker_artifacts(wrong)
        except RuntimeError as error:
            assert maven.KAFKA_VERSION_ENV in str(error)
        else:
            raise AssertionError(f"{wrong} was accepted")


def test_pipeline_grants_are_exactly_what_a_pipeline_needs_minus_what_a_test_withholds():
    from devtools.kafka_secured import pipeline_grants

    every = {(g.operation, g.resource_type, g.name, g.prefixed) for g in pipeline_grants("u", "in-", "out-", "tx")}
    assert every == {("READ", "TOPIC", "in-", True), ("DESCRIBE", "TOPIC", "in-", True),
                     ("WRITE", "TOPIC", "out-", True), ("DESCRIBE", "TOPIC", "out-", True),
                     ("WRITE", "TRANSACTIONAL_ID", "tx", True), ("DESCRIBE", "TRANSACTIONAL_ID", "tx", True),
                     ("DESCRIBE_CONFIGS", "CLUSTER", "kafka-cluster", False),
                     ("IDEMPOTENT_WRITE", "CLUSTER", "kafka-cluster", False)}
    no_txn = pipeline_grants("u", "in-", "out-", "tx", without=("transactional_id",))
    assert {g.resource_type for g in no_txn} == {"TOPIC", "CLUSTER"} and len(no_txn) == 6


def test_the_triggerer_log_server_listens_on_a_reserved_port(tmp_path):
    """Two stacks at once (the demo beside a test run) would collide on Airflow's fixed default ports."""
    from devtools.airflow_stack import AirflowStack

    stack = AirflowStack(tmp_path, [], triggerer=True)
    env = stack.env()
    worker, trigger = (int(env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"]),
                       int(env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"]))
    assert {worker, trigger, stack.port} <= set(ports._held) and len({worker, trigger, stack.port}) == 3
    assert stack.components[-1] == "triggerer" and "triggerer" not in AirflowStack(tmp_path, []).components


def test_demo_check_compares_the_output_with_what_the_input_topic_holds(tmp_path):
    """The demo's check line counts from the input (read off the topic), so a lost or doubled record shows."""
    from collections import Counter

    import pyarrow as pa
    import pyarrow.parquet as pq

    from devtools.demo import _event, verify

    output = tmp_path / "out"
    (output / "_dead_letter").mkdir(parents=True)
    pq.write_table(pa.table({"id": [0, 1, 1]}), output / "part-0.parquet")
    pq.write_table(pa.table({"key": [b"bad-0"]}), output / "_dead_letter" / "part-0.parquet")
    good_in, bad_in = Counter({0: 1, 1: 1, 2: 1}), Counter({b"bad-0": 1})
    line, ok = verify(output, good_in, bad_in)
    assert not ok and line == "exactly-once check: in=4 out=3 dead_letters=1 duplicates=1 missing=1"
    pq.write_table(pa.table({"id": [2]}), output / "part-1.parquet")
    (output / "part-0.parquet").unlink()
    pq.write_table(pa.table({"id": [0, 1]}), output / "part-0.parquet")
    assert verify(output, good_in, bad_in) == ("exactly-once check: in=4 out=3 dead_letters=1 duplicates=0 "
                                               "missing=0", True)
    assert _event(b'{"id": 7}') == {"id": 7}
    assert _event(b"{not json") is None and _event(b'{"id": "bad-1"}') is None


def test_the_demo_closes_kafka_clients_without_kafka_pythons_errors_about_that_close(caplog):
    """A client closed with a metadata refresh in flight: kafka-python logs "Metadata refresh: failed Cancelled" at
    ERROR (the last line of `make demo`), and "Connection lost" when the request was on the wire. The demo drops
    kafka-python's records while it closes; the same records outside a close still show, at the level they had."""
    import logging

    from kafka.errors import Cancelled, KafkaConnectionError

    from devtools.demo import close_kafka_clients

    cluster = logging.getLogger("kafka.cluster")  # as kafka-python's cluster.py logs it: log.error('...%s', exc)
    connection = logging.getLogger("kafka.net.connection")

    class Client:
        def close(self) -> None:
            cluster.error("Metadata refresh: failed %s", Cancelled())
            connection.error("node 1: Connection lost: %s", KafkaConnectionError("closed"))

    with caplog.at_level(logging.INFO, logger="kafka"):
        close_kafka_clients(Client(), Client())
        assert logging.getLogger("kafka").level == logging.INFO
        cluster.error("Metadata refresh: failed %s", Cancelled())
        connection.info("node 1: Connection closed")
    assert [(r.name, r.getMessage()) for r in caplog.records if r.name.startswith("kafka")] == [
        ("kafka.cluster", f"Metadata refresh: failed {Cancelled()}"), ("kafka.net.connection", "node 1: Connection closed")]
