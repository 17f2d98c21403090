"""The classic transaction protocol the Kafka two-phase commit depends on, and the checks that it is spoken.

Ending a transaction from a stored (producer id, epoch) holds only under the classic transaction
protocol, where the epoch of a transaction is the epoch its producer got from InitProducerId.
Transactions v2 (KIP-890, on by default from Kafka 4.0) bump the epoch on every commit and are used
only by clients sending EndTxn version 5 or above. Phase 2 (end_txn.py) caps its EndTxn at version 3
(`END_TXN_VERSION_CAP`, kafka-python 3.0.12's own cap), so Kafka 4.x brokers keep the classic
protocol for it; `end_txn_version()` checks the version it negotiates, and
`check_transaction_protocol()` checks the EndTxn version of every transactional producer of
phase 1 (kafka_python_producer.py): either fails with `TransactionProtocolUnsupported` at 5 or
above. Apart from both phases because both rely on it.

No Airflow or PySpark imports: any worker that has kafka-python imports it.
"""

from __future__ import annotations

from typing import Any

import kafka
import kafka.errors as Errors
from kafka import KafkaProducer

from airflow_exactly_once.sinks.kafka.kafka_python_internals import KAFKA_PYTHON_VERSION_READ, internals_message
from airflow_exactly_once.sinks.kafka.transaction_errors import KafkaInternalsChanged, TransactionProtocolUnsupported

__all__ = ["check_transaction_protocol", "end_txn_version"]

# EndTxn version 5 is transactions v2 (KIP-890 part 2): the epoch changes on every commit.
END_TXN_TRANSACTIONS_V2 = 5
# The highest EndTxn version phase 2 sends: kafka-python 3.0.12's own cap (v4 only adds an error code).
END_TXN_VERSION_CAP = 3


def check_transaction_protocol(producer: KafkaProducer, bootstrap_servers: Any = "") -> int:
    """The EndTxn version `producer` will send to its broker; raise unless it is below 5.

    The version is what kafka-python negotiates: the lower of the cap its EndTxn handler puts
    on the request and the broker's highest EndTxn version (known once the producer has
    bootstrapped, which KafkaProducer does on construction). A kafka-python that raises the
    cap to 5 against a Kafka 4.x broker would make the broker bump the epoch at every commit,
    so a stored (producer id, epoch) could no longer be resumed: refused here, never silently.
    """
    try:
        from kafka.producer.transaction_manager import EndTxnHandler

        request = EndTxnHandler(producer._transaction_manager, True).request
        client = producer._sender._client
    except (ImportError, AttributeError, TypeError) as exc:
        raise KafkaInternalsChanged(internals_message([f"EndTxnHandler(manager, committed).request ({exc})"])) from exc
    cap = request._max_version if request._max_version is not None else type(request).max_version
    try:
        version = client.api_version(request, max_version=cap)
    except Errors.IllegalStateError:  # not bootstrapped: the client's own cap is all we know
        version = cap
    except Errors.IncompatibleBrokerVersion as exc:
        raise _no_end_txn(bootstrap_servers, exc) from exc
    return _classic_end_txn(version, bootstrap_servers)


def _classic_end_txn(version: int, bootstrap_servers: Any) -> int:
    """`version` if EndTxn at that version keeps the classic protocol, else TransactionProtocolUnsupported."""
    if version >= END_TXN_TRANSACTIONS_V2:
        raise TransactionProtocolUnsupported(
            f"the installed kafka-python {getattr(kafka, '__version__', '?')} would end transactions with EndTxn "
            f"v{version} against the brokers at {bootstrap_servers}: transactions v2 (KIP-890) bump the producer "
            "epoch on every commit, so a pre-committed transaction could not be resumed and committed by "
            f"notify_complete. Install kafka-python=={KAFKA_PYTHON_VERSION_READ} (it ends transactions with "
            "EndTxn v3, which Kafka 4.x brokers serve with the classic protocol), or set the sink's guarantee to "
            "AT_LEAST_ONCE.")
    return version


def _no_end_txn(bootstrap_servers: Any, exc: BaseException) -> TransactionProtocolUnsupported:
    return TransactionProtocolUnsupported(
        f"the Kafka brokers at {bootstrap_servers} do not support EndTxn ({exc}); the Kafka sink's "
        "EXACTLY_ONCE needs brokers with transactions (Kafka 0.11 or later)")


def end_txn_version(broker_version_data: Any, bootstrap_servers: Any = "") -> int:
    """The EndTxn version phase 2 sends to brokers described by `broker_version_data` (kafka-python's
    BrokerVersionData); raise unless it keeps the classic protocol (below 5).

    Phase 2 caps its requests at END_TXN_VERSION_CAP; this checks that kafka-python honours the cap.
    """
    from kafka.protocol.producer.transaction import EndTxnRequest

    request = EndTxnRequest(transactional_id="", producer_id=-1, producer_epoch=-1, committed=True,
                            max_version=END_TXN_VERSION_CAP)
    if broker_version_data is None:  # not bootstrapped: the cap is all we know
        return _classic_end_txn(END_TXN_VERSION_CAP, bootstrap_servers)
    try:
        version = broker_version_data.api_version(request)
    except Errors.IncompatibleBrokerVersion as exc:
        raise _no_end_txn(bootstrap_servers, exc) from exc
    return _classic_end_txn(version, bootstrap_servers)
