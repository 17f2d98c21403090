"""Pure rules of the Kafka sink: the transaction timeout guardrail and the configuration checks.

No Kafka, Spark or Airflow needed: these are the decisions, not the I/O.
"""

from __future__ import annotations

import pytest

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.txn_budget import RetryBudget, check_broker_maximum, check_transaction_timeout
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import create_committer, create_writer
from airflow_exactly_once.sinks.kafka import librdkafka
from airflow_exactly_once.sinks.kafka.transactional_ids import PER_BATCH, IdNaming
from airflow_exactly_once.sinks.kafka.writer import transactional_id


def budget(task_id: str, retries: int = 0, delay: float = 0, timeout: float | None = 60, **kw) -> RetryBudget:
    return RetryBudget(task_id, retries, delay, timeout, **kw)


def test_timeout_that_outlives_every_retry_passes():
    warnings = check_transaction_timeout(600_000, budget("g.write", timeout=120),
                                         budget("g.notify_complete", retries=3, delay=10, timeout=30))
    assert warnings == []  # 120 + 4 x 30 + 3 x 10 = 270 s < 600 s


def test_timeout_shorter_than_the_retry_schedule_names_the_numbers():
    with pytest.raises(ConfigurationError) as error:
        check_transaction_timeout(200_000, budget("g.write", timeout=120),
                                  budget("g.notify_complete", retries=3, delay=10, timeout=30))
    text = str(error.value)
    assert "transaction_timeout_ms=200000" in text and "270 s" in text
    assert "Raise the sink's transaction_timeout_ms above 270000" in text
    assert "lower g.notify_complete's retries, retry_delay or execution_timeout" in text


def test_exponential_backoff_counts_its_longest_waits():
    notify = budget("n", retries=3, delay=10, timeout=None, exponential_backoff=True, max_retry_delay_s=50)
    assert notify.delays() == [20, 40, 50]  # Airflow waits up to 2 x delay x 2^n, capped
    with pytest.raises(ConfigurationError, match="110 s"):
        check_transaction_timeout(100_000, budget("w", timeout=None), notify)


def test_unbounded_tasks_are_checked_as_far_as_possible_and_warned_about():
    warnings = check_transaction_timeout(60_000, budget("w", timeout=None), budget("n", retries=2, delay=5,
                                                                                    timeout=None))
    assert len(warnings) == 2 and all("execution_timeout" in w for w in warnings)
    assert "does not know this pipeline's write task" in check_transaction_timeout(60_000, None,
                                                                                  budget("n", timeout=None))[0]


def test_broker_maximum():
    check_broker_maximum(900_000, 900_000)
    with pytest.raises(ConfigurationError, match="transaction.max.timeout.ms=900000") as error:
        check_broker_maximum(900_001, 900_000)
    assert "Lower the sink's transaction_timeout_ms to at most 900000" in str(error.value)


def pipeline(**overrides) -> PipelineConfig:
    values = dict(pipeline_id="p", topics=["in"], sink={"type": "kafka", "topic": "out"},
                  bootstrap_servers="127.0.0.1:1")
    values.update(overrides)
    return PipelineConfig(**values)


def test_guarantee_and_mirror_group_are_validated():
    assert create_committer(checked(pipeline()).sink).guarantee == "EXACTLY_ONCE"
    with pytest.raises(ConfigurationError, match="guarantee='exactly-once' is not supported; choose one of NONE, "
                                                 "AT_LEAST_ONCE, EXACTLY_ONCE"):
        checked(pipeline(guarantee="exactly-once"))
    with pytest.raises(ConfigurationError, match="kafka sink does not implement guarantee='exactly-once'"):
        create_committer({"type": "kafka", "topic": "out", "guarantee": "exactly-once"}).bind(checked(pipeline()))
    with pytest.raises(ConfigurationError, match="mirror_consumer_group"):
        checked(pipeline(mirror_consumer_group="  "))
    # Older ledger rows have neither field: they load with the defaults.
    legacy = {k: v for k, v in pipeline().to_dict().items() if k not in ("guarantee", "mirror_consumer_group")}
    assert create_committer(checked(PipelineConfig.from_dict(legacy)).sink).guarantee == "EXACTLY_ONCE"


@pytest.mark.parametrize("spec, expected", [
    ({"type": "kafka"}, "needs an output 'topic'"),
    ({"type": "kafka", "topic": "out", "transaction_timeout_ms": "soon"}, "transaction_timeout_ms must be a whole"),
    ({"type": "kafka", "topic": "out", "producer_config": {"transactional_id": "x"}}, "must not set transactional.id"),
    ({"type": "kafka", "topic": "out", "producer_config": {"lingerms": 5}}, "does not accept: lingerms"),
    ({"type": "kafka", "topic": "out", "producer_config": {"linger.ms": "soon"}}, "does not accept: linger.ms"),
    ({"type": "kafka", "topic": "out", "partitioner": "x"}, "the kafka sink has no setting 'partitioner'"),
    ({"type": "kafka", "topic": "out", "producer_conf": {}}, "'producer_conf' (did you mean 'producer_config'?)"),
])
@pytest.mark.parametrize("create", [create_writer, create_committer])
def test_bad_sink_specs_fail_clearly(spec, expected, create):
    with pytest.raises(ConfigurationError) as error:
        create(spec)
    assert expected in str(error.value)


def test_sink_binds_to_the_pipeline():
    config = checked(pipeline(guarantee="AT_LEAST_ONCE", kafka_config={"security.protocol": "PLAINTEXT",
                                                               "fetch.max.bytes": 1}))
    sink = create_committer({**config.sink, "producer_config": {"linger_ms": 5}}).bind(config)  # kafka-python's name
    assert sink.output.client_settings().bootstrap_servers == "127.0.0.1:1"
    assert sink.output.producer_config == {"linger.ms": 5}
    assert sink.commit_deadline_ms() is None  # no transaction: nothing to time out
    exactly = checked(pipeline())
    assert create_committer(exactly.sink).bind(exactly).commit_deadline_ms() == 600_000
    # The output cluster's own servers and settings, when the sink names them.
    own = create_committer({"type": "kafka", "topic": "out", "bootstrap_servers": "out:9092",
                            "kafka_config": {"client.id": "w"}}).bind(exactly).output
    assert own.client_settings().bootstrap_servers == "out:9092" and own.client_settings().properties == {
        "client.id": "w"}


@pytest.mark.parametrize("naming", [IdNaming("orders-1", PER_BATCH), IdNaming("orders-1", slots=4)])
def test_transactional_ids_of_a_batch_never_match_another_batch_or_pipeline(naming):
    pattern = naming.batch_pattern(3)
    import re

    assert re.fullmatch(pattern, transactional_id("orders-1", 3, 12))
    assert re.fullmatch(pattern, naming.transactional_id(3, 12))
    for other in (transactional_id("orders-1", 31, 2), transactional_id("orders", 1, 3),
                  transactional_id("orders-1-3", 1, 0), transactional_id("orders-1", 3, 1) + "-0"):
        assert not re.fullmatch(pattern, other), other


def test_transactional_producers_connect_to_every_broker_unless_told_otherwise():
    """With sparse connections librdkafka often waits 0.5 s for the transaction coordinator in init_transactions."""
    servers = {"bootstrap.servers": "b:9092"}
    exactly = librdkafka.producer_properties(servers, "EXACTLY_ONCE", "p-1-0", 60_000)
    assert exactly["enable.sparse.connections"] is False
    assert exactly["transactional.id"] == "p-1-0" and exactly["enable.idempotence"] is True
    told = librdkafka.producer_properties({**servers, "enable.sparse.connections": True, "transactional.id": "x"},
                                          "EXACTLY_ONCE", "p-1-0", 60_000)
    assert told["enable.sparse.connections"] is True  # the user's producer_config wins over the default...
    assert told["transactional.id"] == "p-1-0"  # ...never over what the guarantee needs
    for guarantee in ("AT_LEAST_ONCE", "NONE"):
        assert "enable.sparse.connections" not in librdkafka.producer_properties(servers, guarantee)
