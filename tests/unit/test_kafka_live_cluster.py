"""LiveCluster asks again through a fresh admin client when a node did not answer (pure logic, fake clients)."""

from __future__ import annotations

import kafka.errors as Errors
import pytest

from airflow_exactly_once.kafka import liveness
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks.kafka import hanging, live_cluster, probe
from airflow_exactly_once.sinks.kafka.batch_transactions import BatchTransactions
from airflow_exactly_once.sinks.kafka.output import KafkaOutput
from airflow_exactly_once.sinks.kafka.live_cluster import LiveCluster, node_unreachable


class FakeAdmin:
    """An admin client whose cached metadata still routes to a dead node (`dead`) or not."""

    def __init__(self, name: str, dead: bool) -> None:
        self.name, self.dead, self.closed = name, dead, False

    def list_open(self) -> str:
        if self.dead:
            raise Errors.KafkaConnectionError("Connection refused (node 2, cached)")
        return f"answered by {self.name}"

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch):
    monkeypatch.setattr(liveness.time, "sleep", lambda _s: None)


def settings() -> KafkaSettings:
    return KafkaSettings(bootstrap_servers="127.0.0.1:1,127.0.0.1:2")


def test_a_dead_node_in_the_cached_metadata_is_asked_around_through_a_fresh_client():
    stale = FakeAdmin("stale", dead=True)
    made: list[FakeAdmin] = []

    def fresh(_settings):
        made.append(FakeAdmin(f"fresh-{len(made)}", dead=len(made) == 0))  # the first one still sees the node
        return made[-1]

    live = LiveCluster(settings(), stale, new_admin=fresh)
    assert live.ask("listing", lambda admin: admin.list_open()) == "answered by fresh-1"
    assert [a.closed for a in made] == [True, False]  # the fresh one that failed was closed when replaced
    live.close()
    assert made[1].closed and not stale.closed  # the caller's client is the caller's to close


def test_an_error_about_the_question_itself_is_raised_at_once():
    calls = []

    def refused(_admin):
        calls.append(1)
        raise Errors.TopicAuthorizationFailedError("no READ on the topic")

    live = LiveCluster(settings(), FakeAdmin("a", dead=False), new_admin=lambda _s: pytest.fail("not renewed"))
    with pytest.raises(Errors.TopicAuthorizationFailedError):
        live.ask("listing", refused)
    assert calls == [1]


def test_a_cluster_that_never_answers_raises_the_last_error_after_the_patience(monkeypatch):
    made: list[FakeAdmin] = []

    def fresh(_settings):
        made.append(FakeAdmin("fresh", dead=True))
        return made[-1]

    clock = iter(range(0, 10_000, 5))  # every look at the clock: 5 s later
    live = LiveCluster(settings(), FakeAdmin("stale", dead=True), patience_s=30.0, new_admin=fresh)
    monkeypatch.setattr(liveness.time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(Errors.KafkaConnectionError):
        live.ask("listing", lambda admin: admin.list_open())
    # Asked at 5, 10, 15, 20, 25 and 30 s (pauses 0.5, 1, 2, 4, 4 s): a fresh client before each of the five
    # tries after the first; at 30 s the next pause would end past the 30 s patience, so it gave up.
    assert len(made) == 5


def test_a_bootstrap_that_fails_keeps_asking_with_the_client_it_has():
    answers = iter([Errors.KafkaTimeoutError("bootstrap"), FakeAdmin("fresh", dead=False)])

    def fresh(_settings):
        made = next(answers)
        if isinstance(made, Exception):
            raise made
        return made

    live = LiveCluster(settings(), FakeAdmin("stale", dead=True), new_admin=fresh)
    assert live.ask("listing", lambda admin: admin.list_open()) == "answered by fresh"


@pytest.mark.parametrize(("error", "again"), [
    (Errors.KafkaConnectionError(), True),
    (Errors.NodeNotReadyError(), True),
    (Errors.NotCoordinatorError(), True),
    (Errors.CoordinatorLoadInProgressError(), True),
    (Errors.NotLeaderForPartitionError(), True),
    (Errors.UnknownBrokerIdError(), True),
    (Errors.UnknownTopicOrPartitionError(), False),
    (Errors.TopicAuthorizationFailedError(), False),
    (Errors.ClusterAuthorizationFailedError(), False),
    (ValueError(), False),
])
def test_which_errors_mean_a_node_did_not_answer(error, again):
    assert node_unreachable(error) is again


def test_what_holds_a_partition_back_is_asked_around_a_dead_node(monkeypatch):
    """BatchTransactions.holders (the detail of notify_complete's "cannot tell yet") goes through LiveCluster: the
    commit's client that still routes to the dead node is replaced, not reported as the answer."""
    stale, made = FakeAdmin("stale", dead=True), []

    def fresh(_settings):  # the first fresh client's metadata still lists the node: the cluster has not fenced it
        made.append(FakeAdmin(f"fresh-{len(made)}", dead=len(made) == 0))
        return made[-1]

    monkeypatch.setattr(probe, "new_admin_client", fresh)
    held = hanging.OpenTransaction("out", 0, 42, 3, 1, 100)

    def open_transactions(admin, partitions):
        admin.list_open()  # the stale client raises: ECONNREFUSED at the dead node
        return [held]

    monkeypatch.setattr(hanging, "open_transactions", open_transactions)
    monkeypatch.setattr(hanging, "coordinator_views",
                        lambda admin, settings, pids, known: {42: (hanging.CoordinatorView("p-1-0", "Ongoing", 42, 3), set())})
    transactions = BatchTransactions(KafkaOutput({"type": "kafka", "topic": "out"}, "EXACTLY_ONCE"), settings(),
                                     stale, lambda: {42: hanging.Owner(7, False, ())})
    said = transactions.holders("out", 0, 150)
    assert said.startswith("held back by ") and "this pipeline's batch 7" in said, said
    assert [a.closed for a in made] == [True, True] and not stale.closed  # the commit's own client is kept open


class TransactionLogAdmin:
    """Lists one coordinator's transactions; the transaction log's partition 1 led by `leader_of_1`. Node 2 died a
    moment ago: the controller fenced it (Kafka 4 lists it, marked), and a request to it would fail."""

    def __init__(self, leader_of_1: int) -> None:
        self.leader_of_1 = leader_of_1
        self.asked: list[int] = []

    def describe_cluster(self) -> dict:
        return {"brokers": [{"broker_id": b, "host": "127.0.0.1", "port": 9000 + b, "is_fenced": b == 2}
                            for b in (1, 2, 3)]}

    def list_transactions(self, broker_ids: list[int]) -> dict:
        if 2 in broker_ids:
            raise Errors.UnknownBrokerIdError(2)
        self.asked += broker_ids
        row = type("Row", (), {"transactional_id": "p-1-0", "state": type("S", (), {"value": "Ongoing"})()})()
        return {1: [row]}

    def describe_configs(self, resources: list, config_filter: str) -> dict:
        names = [r.name for r in resources]
        if "2" in names:  # kafka-python sends a broker's config request to that broker
            raise Errors.UnknownBrokerIdError(2)
        return {"broker": {n: {"transaction.max.timeout.ms": {"value": str(800_000 + int(n))}} for n in names}}

    def describe_topics(self, topics: list[str]) -> list[dict]:
        assert topics == [probe.TRANSACTION_LOG]
        return [{"error_code": 0, "partitions": [{"partition_index": 0, "leader_id": 1},
                                                  {"partition_index": 1, "leader_id": self.leader_of_1}]}]


@pytest.fixture
def every_unfenced_node_answers(monkeypatch):
    monkeypatch.setattr(probe, "silent", lambda _settings, servers: {})


def test_transactions_are_not_listed_while_a_partition_of_the_transaction_log_has_no_live_leader(
        every_unfenced_node_answers):
    """A dead node's coordinators list nothing until their partitions moved: a partial list would read as 'nothing
    open' to the abort that fences what it finds; LiveCluster asks again (the error is retriable) and the error
    names the node that is away."""
    with pytest.raises(Errors.CoordinatorNotAvailableError,
                       match=r"partition\(s\) 1 led by node 2, which is fenced by the controller") as unled:
        probe.matching_transactions(TransactionLogAdmin(leader_of_1=2), settings(), r"p-\d+-\d+")
    assert node_unreachable(unled.value)
    moved = TransactionLogAdmin(leader_of_1=3)
    assert probe.matching_transactions(moved, settings(), r"p-\d+-\d+") == {"p-1-0": "Ongoing"}
    assert moved.asked == [1, 3]  # the fenced node is not asked (kafka-python has no address for it)


def test_a_fenced_node_is_left_out_of_the_transaction_timeout_maximum_and_named(every_unfenced_node_answers):
    """Kafka 4's DescribeCluster lists a fenced node (kafka-python asks with include_fenced_brokers): asking it for
    its configuration raised UnknownBrokerIdError and failed every plan while one node of three was down."""
    maximum = probe.broker_max_transaction_timeout_ms(TransactionLogAdmin(leader_of_1=1), settings())
    assert maximum.ms == 800_001 and maximum.brokers.serving == (1, 3)
    assert "node 2 is fenced by the controller" in maximum.brokers.note()


def test_a_node_that_does_not_answer_is_left_out_and_named(monkeypatch):
    """A paused node is not fenced for the first seconds: the liveness check leaves it out of every per-broker
    question, with what happened."""
    asked = []

    def silent(_settings, servers):
        asked.append(dict(servers))
        return {3: "gave no answer within 2 s"}

    monkeypatch.setattr(probe, "silent", silent)
    brokers = probe.serving_brokers(TransactionLogAdmin(leader_of_1=1), settings())
    assert asked == [{1: "127.0.0.1:9001", 3: "127.0.0.1:9003"}]  # the fenced node is not even probed
    assert brokers.serving == (1,)
    assert dict(brokers.away) == {2: "is fenced by the controller (down or cut off)",
                                  3: "at 127.0.0.1:9003 gave no answer within 2 s"}
    with pytest.raises(Errors.CoordinatorNotAvailableError, match=r"partition\(s\) 1 led by node 3, which at 127"):
        probe.matching_transactions(TransactionLogAdmin(leader_of_1=3), settings(), r"p-\d+-\d+")


class LaggingBrokerAdmin:
    """Answers UNKNOWN_TOPIC_OR_PARTITION `unknown_answers` times (a broker that has not yet heard of a topic created
    a moment ago), then the topic's two partitions."""

    def __init__(self, unknown_answers: int) -> None:
        self.unknown_answers, self.asked = unknown_answers, 0

    def describe_topics(self, topics: list[str]) -> list[dict]:
        self.asked += 1
        if self.asked <= self.unknown_answers:
            return [{"error_code": Errors.UnknownTopicOrPartitionError.errno, "partitions": []}]
        return [{"error_code": 0, "partitions": [{"partition_index": 0}, {"partition_index": 1}],
                 "authorized_operations": None}]


def test_a_topic_a_lagging_broker_does_not_know_yet_is_found_within_the_settle_time(monkeypatch):
    clock = iter(range(0, 1000))
    monkeypatch.setattr(probe.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(probe.time, "sleep", lambda _s: None)
    assert probe.topic_partitions(LaggingBrokerAdmin(unknown_answers=2), "new", settle_s=5.0) == 2
    # without a settle time (a sweep of a deleted topic) the first answer is believed; a topic missing for longer
    # than the settle time does not exist
    assert probe.topic_partitions(LaggingBrokerAdmin(unknown_answers=2), "new") == 0
    missing = LaggingBrokerAdmin(unknown_answers=100)
    assert probe.topic_partitions(missing, "gone", settle_s=5.0) == 0 and 1 < missing.asked < 10
