"""The transaction adapter refuses a client that would end transactions with transactions v2 (KIP-890),
and names the kafka-python internals it misses.

No broker: the producers are given the broker release (`api_version`), whose EndTxn versions
kafka-python knows, so they negotiate as they would against that broker. The client's own cap is
faked by building kafka-python's EndTxn handler with another `max_version`, as a kafka-python
release implementing KIP-890 would. tests/integration/test_kafka_transactions.py runs the same
check against the real 3.9 and 4.x brokers.
"""

from __future__ import annotations

import pytest
from kafka import KafkaProducer
from kafka.producer import transaction_manager
from kafka.protocol.broker_version_data import BrokerVersionData

from airflow_exactly_once.sinks.kafka import kafka_python_internals, transaction_protocol
from airflow_exactly_once.sinks.kafka.kafka_python_internals import check_kafka_python_internals
from airflow_exactly_once.sinks.kafka.kafka_python_producer import _new_producer
from airflow_exactly_once.sinks.kafka.transaction_errors import KafkaInternalsChanged, TransactionProtocolUnsupported
from airflow_exactly_once.sinks.kafka.transaction_protocol import (
    END_TXN_TRANSACTIONS_V2,
    END_TXN_VERSION_CAP,
    check_transaction_protocol,
    end_txn_version,
)

KAFKA_3_9, KAFKA_4_0 = (3, 9), (4, 0)


@pytest.fixture
def producer_for():
    made: list[KafkaProducer] = []

    def make(broker_release: tuple[int, int]) -> KafkaProducer:
        made.append(KafkaProducer(bootstrap_servers="127.0.0.1:9", transactional_id="t", api_version=broker_release))
        return made[-1]

    yield make
    for producer in made:
        producer.close(timeout=0)


@pytest.fixture
def client_end_txn_cap(monkeypatch):
    """Make kafka-python's EndTxn handler cap its request at another version (None: no cap)."""
    original = transaction_manager.EndTxnHandler.__init__

    def set_cap(cap: int | None) -> None:
        def init(self, manager, committed):
            original(self, manager, committed)
            self.request._max_version = cap

        monkeypatch.setattr(transaction_manager.EndTxnHandler, "__init__", init)

    return set_cap


def test_the_installed_client_ends_transactions_below_v5_against_both_brokers(producer_for):
    assert check_transaction_protocol(producer_for(KAFKA_3_9)) == 3
    assert check_transaction_protocol(producer_for(KAFKA_4_0)) == 3


def test_a_client_speaking_transactions_v2_is_refused_against_kafka_4(producer_for, client_end_txn_cap):
    client_end_txn_cap(5)
    with pytest.raises(TransactionProtocolUnsupported) as refused:
        check_transaction_protocol(producer_for(KAFKA_4_0), "b:9092")
    assert refused.value.retriable is False
    assert "EndTxn v5" in str(refused.value) and "b:9092" in str(refused.value)
    assert "kafka-python==3.0.12" in str(refused.value)
    # Kafka 3.9 answers EndTxn up to v4: the same client keeps the classic protocol there.
    assert check_transaction_protocol(producer_for(KAFKA_3_9)) == 4 < END_TXN_TRANSACTIONS_V2


def test_an_uncapped_client_is_judged_by_the_broker_and_never_silently(producer_for, client_end_txn_cap):
    client_end_txn_cap(None)
    assert check_transaction_protocol(producer_for(KAFKA_3_9)) == 4
    with pytest.raises(TransactionProtocolUnsupported):
        check_transaction_protocol(producer_for(KAFKA_4_0))


def test_every_transactional_producer_of_the_adapter_is_checked(client_end_txn_cap):
    client_end_txn_cap(5)
    with pytest.raises(TransactionProtocolUnsupported):
        _new_producer("127.0.0.1:9", "t", 60_000, {"api_version": KAFKA_4_0})


# --------------------------------------------------------------------------- phase 2: EndTxn sent by the adapter itself


def test_the_adapters_own_end_txn_keeps_the_classic_protocol_against_both_brokers():
    assert end_txn_version(BrokerVersionData(KAFKA_3_9)) == 3
    assert end_txn_version(BrokerVersionData(KAFKA_4_0)) == 3
    assert end_txn_version(None) == END_TXN_VERSION_CAP  # not bootstrapped: the cap is all there is


def test_a_cap_at_transactions_v2_is_refused_against_kafka_4(monkeypatch):
    monkeypatch.setattr(transaction_protocol, "END_TXN_VERSION_CAP", 5)
    with pytest.raises(TransactionProtocolUnsupported) as refused:
        end_txn_version(BrokerVersionData(KAFKA_4_0), "b:9092")
    assert "EndTxn v5" in str(refused.value) and "b:9092" in str(refused.value) and not refused.value.retriable
    assert end_txn_version(BrokerVersionData(KAFKA_3_9)) == 4  # Kafka 3.9 answers EndTxn up to v4


def test_brokers_without_transactions_are_named():
    with pytest.raises(TransactionProtocolUnsupported, match="b:9092 do not support EndTxn"):
        end_txn_version(BrokerVersionData((0, 10, 0)), "b:9092")


def test_missing_protocol_fields_and_admin_internals_are_named(monkeypatch):
    monkeypatch.setitem(kafka_python_internals._PROTOCOL_FIELDS,
                        ("kafka.protocol.producer.transaction", "EndTxnRequest"), ("transactional_id", "no_such"))

    class NotAnAdminClient:
        config = {"bootstrap_servers": "b:9092"}

    with pytest.raises(KafkaInternalsChanged) as changed:
        check_kafka_python_internals(admin=NotAnAdminClient())
    text = str(changed.value)
    assert "EndTxnRequest.no_such" in text and "EndTxnRequest.transactional_id" not in text
    assert "KafkaAdminClient._manager.run()" in text and "KafkaAdminClient._manager.send()" in text
    assert "KafkaAdminClient.config['max_in_flight_requests_per_connection']" in text
    assert "Install kafka-python==3.0.12" in text
    assert text.startswith(f"{kafka_python_internals.__name__} drives kafka-python internals")  # the module that exists
    monkeypatch.undo()
    check_kafka_python_internals()  # the installed kafka-python has everything
