"""kafka_transactions against a real Apache Kafka broker (no mocks).

Visibility checks never rely on "nothing arrived within N seconds": every read
first waits until the partition is settled (last stable offset == high
watermark, i.e. no open transaction and all markers written) and then reads
until the consumer's position reaches that offset, so a missing record is a
real absence, not a slow broker.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from devtools.kafka_broker import LocalKafkaBroker
from airflow_exactly_once.core.errors import TransactionLostError
from airflow_exactly_once.sinks.kafka import end_txn
from airflow_exactly_once.sinks.kafka.end_txn import abort_transaction, commit_transaction, coordinator_client, end_transactions
from airflow_exactly_once.sinks.kafka.kafka_python_producer import open_transaction, pre_commit
from airflow_exactly_once.sinks.kafka.transaction_errors import KafkaTransactionError, TransactionCoordinatorUnavailable
from airflow_exactly_once.sinks.kafka.transaction_handle import TransactionHandle
from airflow_exactly_once.sinks.kafka.transaction_protocol import END_TXN_TRANSACTIONS_V2, check_transaction_protocol
from tests.kafka_helpers import settled_transaction_state

REPO_ROOT = Path(__file__).resolve().parents[2]
TXN_TIMEOUT_MS = 30_000


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    broker = LocalKafkaBroker(
        tmp_path_factory.mktemp("kafka-txn-broker"),
        port=0,
        transaction_max_timeout_ms=60_000,
        # Expired transactions are aborted within about a second (test 4).
        extra_config={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"},
    )
    try:
        broker.start(timeout=90)
    except Exception as exc:
        log_tail = broker.log_file.read_text(errors="replace")[-3000:] if broker.log_file.exists() else ""
        pytest.fail(f"The real Kafka broker could not start ({exc}); these tests need it.\n{log_tail}",
                    pytrace=False)
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def admin(broker):
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    yield client
    client.close()


@pytest.fixture
def topic(admin):
    name = f"txn-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
    return name


def txn_id() -> str:
    return f"tid-{uuid.uuid4().hex[:10]}"


def end_offset(bootstrap: str, topic: str, isolation: str, partition: int = 0) -> int:
    """High watermark (read_uncommitted) or last stable offset (read_committed)."""
    tp = TopicPartition(topic, partition)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation)
    try:
        return consumer.end_offsets([tp])[tp]
    finally:
        consumer.close()


def settled_end(bootstrap: str, topic: str, partition: int = 0, timeout_s: float = 20.0) -> int:
    """The partition's end offset once no transaction is open on it (LSO == high watermark)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lso = end_offset(bootstrap, topic, "read_committed", partition)
        hw = end_offset(bootstrap, topic, "read_uncommitted", partition)
        if lso == hw:
            return hw
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic}-{partition} still has an open transaction: LSO {lso} < high watermark {hw}")
        time.sleep(0.1)


def read_partition(bootstrap: str, topic: str, partition: int, start: int, end: int, isolation: str,
                   timeout_s: float = 20.0) -> list[bytes]:
    """Values of the records in [start, end) visible under `isolation`.

    Reads until the consumer's position reaches `end` (it also moves past
    aborted records and transaction markers) and fails if it cannot.
    """
    tp = TopicPartition(topic, partition)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation,
                             enable_auto_commit=False, consumer_timeout_ms=500)
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        values: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise AssertionError(f"Reading {tp} [{start}, {end}) as {isolation} stalled at "
                                     f"{consumer.position(tp)}")
            for record in consumer:
                if record.offset < end:
                    values.append(record.value)
                if consumer.position(tp) >= end:
                    break
        return values
    finally:
        consumer.close()


def visible(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[bytes]:
    return read_partition(bootstrap, topic, 0, 0, settled_end(bootstrap, topic), isolation)


def write_and_pre_commit(bootstrap: str, transactional_id: str, topic: str, values: list[bytes],
                         timeout_ms: int = TXN_TIMEOUT_MS) -> TransactionHandle:
    producer = open_transaction(bootstrap, transactional_id, timeout_ms)
    for value in values:
        producer.send(topic, value)
    return pre_commit(producer)


def transaction_state(admin: KafkaAdminClient, transactional_id: str) -> str:
    return admin.describe_transactions([transactional_id])[transactional_id].state.value


CHILD = textwrap.dedent("""
    import json, sys, time
    from airflow_exactly_once.sinks.kafka.kafka_python_producer import open_transaction, pre_commit
    bootstrap, transactional_id, topic, mode = sys.argv[1:5]
    producer = open_transaction(bootstrap, transactional_id, int(sys.argv[5]))
    for i in range(3):
        producer.send(topic, b"child-%d" % i)
    handle = pre_commit(producer)
    print(json.dumps(handle.to_dict()), flush=True)
    if mode == "wait-for-kill":
        time.sleep(600)
""")


def pre_commit_in_subprocess(bootstrap: str, transactional_id: str, topic: str, kill: bool) -> TransactionHandle:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, bootstrap, transactional_id, topic,
         "wait-for-kill" if kill else "exit", str(TXN_TIMEOUT_MS)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        line = child.stdout.readline()
        if kill:
            child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if not line:
        raise AssertionError(f"child produced no handle (rc={child.returncode}):\n{child.stderr.read()[-3000:]}")
    assert child.returncode == (-signal.SIGKILL if kill else 0), child.stderr.read()[-3000:]
    return TransactionHandle.from_dict(json.loads(line))


# --------------------------------------------------------------------------- tests


def test_transactions_keep_the_classic_protocol_on_this_broker(broker, topic, admin):
    """Kafka 4.x serves transactions v2 (KIP-890: EndTxn v5 bumps the epoch at every commit); the adapter's
    client ends transactions with EndTxn v3, so the broker keeps the classic protocol: the committed
    transaction still has the epoch of the handle that committed it. On Kafka 3.9 the same holds trivially."""
    from kafka.protocol.api_key import ApiKey

    # Raw API versions: Kafka 4.4 also lists keys kafka-python's ApiKey enum does not know.
    node = admin.describe_cluster()["brokers"][0]["broker_id"]
    broker_end_txn = admin.get_broker_version_data(node).api_versions[ApiKey.EndTxn.value][1]
    assert (broker_end_txn >= END_TXN_TRANSACTIONS_V2) is broker.version.startswith("4.")
    tid = txn_id()
    producer = open_transaction(broker.bootstrap_servers, tid, TXN_TIMEOUT_MS)
    assert check_transaction_protocol(producer, broker.bootstrap_servers) == 3
    producer.send(topic, b"v")
    handle = pre_commit(producer)
    commit_transaction(broker.bootstrap_servers, handle)
    assert visible(broker.bootstrap_servers, topic) == [b"v"]
    deadline = time.monotonic() + 20
    while (described := admin.describe_transactions([tid])[tid]).state.value != "CompleteCommit":
        assert described.state.value == "PrepareCommit" and time.monotonic() < deadline, described
        time.sleep(0.2)
    assert described.producer_epoch == handle.epoch  # transactions v2 would have bumped it at the commit


def test_aborted_records_invisible_to_read_committed_only(broker, topic):
    """The broker is real: an aborted transaction's records exist but read_committed skips them."""
    bootstrap = broker.bootstrap_servers
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id())
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"aborted-1")
        producer.send(topic, b"aborted-2")
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(topic, b"committed-1")
        producer.commit_transaction()
    finally:
        producer.close()

    assert visible(bootstrap, topic, "read_committed") == [b"committed-1"]
    assert visible(bootstrap, topic, "read_uncommitted") == [b"aborted-1", b"aborted-2", b"committed-1"]


@pytest.mark.parametrize("kill", [False, True], ids=["child-exits", "child-sigkilled"])
def test_commit_from_another_process(broker, topic, admin, kill):
    """Phase 1 in a process that then dies, phase 2 here: exactly the records, once."""
    bootstrap = broker.bootstrap_servers
    tid = txn_id()
    handle = pre_commit_in_subprocess(bootstrap, tid, topic, kill=kill)
    assert handle.transactional_id == tid and handle.started
    assert handle.partitions == ((topic, 0),)

    # The writer is gone but its transaction is still open on the broker and hides the records.
    assert transaction_state(admin, tid) == "Ongoing"
    assert end_offset(bootstrap, topic, "read_committed") == 0  # last stable offset is held back
    assert read_partition(bootstrap, topic, 0, 0, 3, "read_uncommitted") == [b"child-0", b"child-1", b"child-2"]

    commit_transaction(bootstrap, handle)

    assert visible(bootstrap, topic) == [b"child-0", b"child-1", b"child-2"]


def test_second_commit_is_a_noop(broker, topic):
    """Committing a committed handle again succeeds without effect (the broker answers
    EndTxn(commit) on a PrepareCommit/CompleteCommit transaction of the same epoch with success)."""
    bootstrap = broker.bootstrap_servers
    handle = write_and_pre_commit(bootstrap, txn_id(), topic, [b"a", b"b"])

    commit_transaction(bootstrap, handle)
    commit_transaction(bootstrap, handle)  # immediately, while markers may still be written
    assert visible(bootstrap, topic) == [b"a", b"b"]
    commit_transaction(bootstrap, handle)  # and once the transaction is CompleteCommit
    # abort can no longer undo it: it reports there was nothing to abort.
    assert abort_transaction(bootstrap, handle) is False

    assert visible(bootstrap, topic) == [b"a", b"b"]
    assert visible(bootstrap, topic, "read_uncommitted") == [b"a", b"b"]


def test_commit_after_broker_timeout_is_lost(broker, topic, admin):
    bootstrap = broker.bootstrap_servers
    tid = txn_id()
    handle = write_and_pre_commit(bootstrap, tid, topic, [b"late"], timeout_ms=3000)

    deadline = time.monotonic() + 30
    while transaction_state(admin, tid) != "CompleteAbort":
        assert time.monotonic() < deadline, f"broker never aborted {tid}: {transaction_state(admin, tid)}"
        time.sleep(0.2)

    with pytest.raises(TransactionLostError) as lost:
        commit_transaction(bootstrap, handle)
    assert lost.value.retriable is False
    assert (lost.value.sink, lost.value.lost) == ("kafka", (handle.transactional_id,))
    # The coordinator bumped the epoch when aborting; kafka-python reports INVALID_PRODUCER_EPOCH as fenced.
    assert "ProducerFencedError" in lost.value.reason

    assert visible(bootstrap, topic) == []
    assert visible(bootstrap, topic, "read_uncommitted") == [b"late"]


def test_zombie_attempt_is_fenced(broker, topic, admin):
    bootstrap = broker.bootstrap_servers
    tid = txn_id()
    zombie = write_and_pre_commit(bootstrap, tid, topic, [b"attempt-1"])

    producer = open_transaction(bootstrap, tid, TXN_TIMEOUT_MS)  # fences attempt 1, aborts its records
    producer.send(topic, b"attempt-2")
    current = pre_commit(producer)
    assert current.producer_id == zombie.producer_id and current.epoch > zombie.epoch

    with pytest.raises(TransactionLostError) as lost:
        commit_transaction(bootstrap, zombie)
    assert "ProducerFencedError" in lost.value.reason
    # Aborting the zombie's handle must not touch attempt 2's open transaction.
    assert abort_transaction(bootstrap, zombie) is False
    assert transaction_state(admin, tid) == "Ongoing"

    commit_transaction(bootstrap, current)
    with pytest.raises(TransactionLostError):
        commit_transaction(bootstrap, zombie)

    assert visible(bootstrap, topic) == [b"attempt-2"]
    assert visible(bootstrap, topic, "read_uncommitted") == [b"attempt-1", b"attempt-2"]


def test_abort_is_idempotent(broker, topic, admin):
    bootstrap = broker.bootstrap_servers
    tid = txn_id()
    handle = write_and_pre_commit(bootstrap, tid, topic, [b"x", b"y"])

    assert abort_transaction(bootstrap, handle) is True
    assert abort_transaction(bootstrap, handle) is True  # same epoch, already aborted: broker says OK
    assert visible(bootstrap, topic) == []
    assert settled_transaction_state(bootstrap, tid) == "CompleteAbort"
    assert abort_transaction(bootstrap, handle) is True

    with pytest.raises(TransactionLostError) as lost:
        commit_transaction(bootstrap, handle)
    assert "InvalidTxnStateError" in lost.value.reason

    # A transaction the broker already timed out: nothing to abort, no error.
    expired = write_and_pre_commit(bootstrap, txn_id(), topic, [b"z"], timeout_ms=3000)
    deadline = time.monotonic() + 30
    while transaction_state(admin, expired.transactional_id) != "CompleteAbort":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert abort_transaction(bootstrap, expired) is False

    assert visible(bootstrap, topic) == []
    assert visible(bootstrap, topic, "read_uncommitted") == [b"x", b"y", b"z"]


def test_unknown_transactional_id_is_lost(broker):
    handle = TransactionHandle(f"never-used-{uuid.uuid4().hex[:8]}", producer_id=123456, epoch=0,
                               partitions=(("whatever", 0),))
    with pytest.raises(TransactionLostError) as lost:
        commit_transaction(broker.bootstrap_servers, handle)
    assert "InvalidProducerIdMappingError" in lost.value.reason
    assert abort_transaction(broker.bootstrap_servers, handle) is False


def test_unreachable_broker_is_retriable():
    with socket_nobody_listens_on() as port:
        handle = TransactionHandle("t", producer_id=1, epoch=0, partitions=(("x", 0),))
        with pytest.raises(TransactionCoordinatorUnavailable) as error:
            commit_transaction(f"127.0.0.1:{port}", handle, bootstrap_timeout_ms=1500)
    assert isinstance(error.value, KafkaTransactionError)
    assert error.value.retriable is True
    assert f"127.0.0.1:{port}" in str(error.value) and "retry" in str(error.value)


def test_empty_transaction_and_handle_round_trip(broker, topic):
    bootstrap = broker.bootstrap_servers
    empty = pre_commit(open_transaction(bootstrap, txn_id(), TXN_TIMEOUT_MS))
    assert empty.started is False and empty.partitions == ()
    commit_transaction(bootstrap, empty)  # nothing on the broker to end
    assert abort_transaction(bootstrap, empty) is False

    handle = write_and_pre_commit(bootstrap, txn_id(), topic, [b"r"])
    restored = TransactionHandle.from_dict(json.loads(json.dumps(handle.to_dict())))
    assert restored == handle
    with pytest.raises(ValueError):
        TransactionHandle.from_dict({"producer_id": 1})
    commit_transaction(bootstrap, restored)
    assert visible(bootstrap, topic) == [b"r"]


class socket_nobody_listens_on:
    """A local port that refuses connections: bound, never listening."""

    def __enter__(self) -> int:
        import socket

        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        return self._socket.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self._socket.close()


def test_a_batch_of_transactions_ends_in_one_call_and_a_fenced_one_is_reported_alone(broker, topic, caplog):
    """Twelve transactions (a batch of twelve Spark partitions), one fenced by a newer attempt before: one call
    commits the other eleven, at most two EndTxn in flight on the connection (max_in_flight below the batch:
    the rest wait for answers instead of being refused and retried), and reports the fenced one lost."""
    bootstrap = broker.bootstrap_servers
    handles = [write_and_pre_commit(bootstrap, txn_id(), topic, [b"t%d-a" % i, b"t%d-b" % i]) for i in range(12)]
    fenced = handles[4]
    open_transaction(bootstrap, fenced.transactional_id, TXN_TIMEOUT_MS).close()  # aborts it, bumps the epoch

    with coordinator_client(bootstrap, max_in_flight_requests_per_connection=2) as client:
        with caplog.at_level(logging.INFO, logger=end_txn.__name__):
            results = end_transactions(client, handles, commit=True)
        assert "Retrying" not in caplog.text  # every EndTxn was sent once: none refused by a full connection
        again = end_transactions(client, handles, commit=True)  # at once, while markers may still be written

    assert list(results) == handles
    assert [h for h, error in results.items() if error is not None] == [fenced]
    assert isinstance(results[fenced], TransactionLostError) and "ProducerFencedError" in results[fenced].reason
    assert [h for h, error in again.items() if error is not None] == [fenced]  # a no-op for the committed ones
    committed = sorted(b"t%d-%s" % (i, part) for i in range(12) if i != 4 for part in (b"a", b"b"))
    assert sorted(visible(bootstrap, topic)) == committed
    assert len(visible(bootstrap, topic, "read_uncommitted")) == 24  # the fenced one's records, aborted


def test_aborting_a_batch_ends_exactly_its_transactions(broker, topic, admin):
    bootstrap = broker.bootstrap_servers
    handles = [write_and_pre_commit(bootstrap, txn_id(), topic, [b"x%d" % i]) for i in range(6)]
    empty = pre_commit(open_transaction(bootstrap, txn_id(), TXN_TIMEOUT_MS))
    commit_transaction(bootstrap, handles[0])  # committed before: an abort cannot take it back
    with coordinator_client(bootstrap) as client:
        results = end_transactions(client, handles + [empty], commit=False)
    assert isinstance(results[handles[0]], TransactionLostError) and "InvalidTxnStateError" in results[handles[0]].reason
    assert all(results[h] is None for h in handles[1:]) and results[empty] is None
    assert [settled_transaction_state(bootstrap, h.transactional_id) for h in handles[1:]] == ["CompleteAbort"] * 5
    assert visible(bootstrap, topic) == [b"x0"]


def test_a_stopped_broker_is_waited_for_within_the_bound_then_reported_retriable(tmp_path):
    """The client connected, then the broker went away: every handle gets a retriable answer naming the
    servers once timeout_ms has passed (not the 30 s request timeout), and the transactions stay open:
    committing again once the broker is back commits them. (A broker of its own: stopping the module's
    would leave its admin client backing off from it.)"""
    broker = LocalKafkaBroker(tmp_path / "kafka", transaction_max_timeout_ms=60_000).start(timeout=90)
    try:
        bootstrap = broker.bootstrap_servers
        topic = f"txn-{uuid.uuid4().hex[:10]}"
        with coordinator_client(bootstrap) as client:
            client.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        handles = [write_and_pre_commit(bootstrap, txn_id(), topic, [b"s%d" % i], timeout_ms=60_000)
                   for i in range(3)]
        with coordinator_client(bootstrap) as client:
            broker.stop()
            try:
                started = time.monotonic()
                results = end_transactions(client, handles, commit=True, timeout_ms=3000)
                waited = time.monotonic() - started
            finally:
                broker.start(timeout=90)
        assert 2.5 < waited < 15
        for handle, error in results.items():
            assert isinstance(error, TransactionCoordinatorUnavailable) and error.retriable, error
            assert bootstrap in str(error) and handle.transactional_id in str(error)
            assert "again with the same handle" in str(error)
        with coordinator_client(bootstrap) as client:
            assert list(end_transactions(client, handles, commit=True).values()) == [None] * 3
        assert sorted(visible(bootstrap, topic)) == [b"s0", b"s1", b"s2"]
    finally:
        broker.stop()


def test_pre_committed_transaction_survives_a_broker_crash(broker, topic, admin):
    """Invariant 1 with a broker restart: the open transaction outlives a SIGKILLed broker."""
    bootstrap = broker.bootstrap_servers
    tid = txn_id()
    # A KRaft broker restarted after SIGKILL takes about 30 s to serve again here, so the
    # transaction gets the longest timeout this broker allows.
    handle = write_and_pre_commit(bootstrap, tid, topic, [b"r-0", b"r-1"], timeout_ms=60_000)
    broker.kill()  # no clean shutdown: the transaction state is recovered from the log
    broker.start(timeout=90)
    assert read_partition(bootstrap, topic, 0, 0, 2, "read_uncommitted") == [b"r-0", b"r-1"]
    assert end_offset(bootstrap, topic, "read_committed") == 0  # still pending after the restart
    commit_transaction(bootstrap, handle)
    assert visible(bootstrap, topic) == [b"r-0", b"r-1"]
