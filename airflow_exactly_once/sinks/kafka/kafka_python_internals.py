"""The kafka-python internals the Kafka sink's transaction adapter drives, and the check that they are still there.

Phase 1 (kafka_python_producer.py) and phase 2 (end_txn.py) of the adapter, and its check of the transaction
protocol (transaction_protocol.py), reach into kafka-python internals; no other module of the project does.
`check_kafka_python_internals()` is called on every use: if kafka-python changed, you get
`KafkaInternalsChanged` naming what is missing instead of a silently wrong commit.

Internals used (read off kafka-python 3.0.12):

* Phase 1 (kafka_python_producer.py), ``kafka/producer/kafka.py`` and ``kafka/producer/transaction_manager.py``:
  ``KafkaProducer._transaction_manager`` (a ``TransactionManager``) with
  ``_lock``, ``_current_state`` (a ``TransactionState``), ``has_error()``,
  ``last_error``, ``producer_id_and_epoch``, ``transactional_id``,
  ``_partitions_in_transaction`` (partitions the broker has acknowledged in
  AddPartitionsToTxn), ``_new_partitions_in_transaction`` /
  ``_pending_partitions_in_transaction`` (not yet acknowledged) and
  ``_transaction_started`` (false when no partitions or offsets were added).
* Phase 2 (end_txn.py), ``kafka/admin/client.py``, ``kafka/net/manager.py`` and
  ``kafka/protocol``:
  ``KafkaAdminClient._manager`` (its ``KafkaConnectionManager``): ``run(coroutine, *args)``
  runs a coroutine on the admin client's I/O thread and returns its result,
  ``send(request, node_id=, request_timeout_ms=)`` returns an awaitable
  ``kafka.future.Future`` of the response (a failed one when the node cannot be
  reached), ``cluster.add_coordinator(row, key_type, key, synthesize_node_id=False)``
  makes a FindCoordinator answer's node addressable, and ``broker_version_data.api_version(request)``
  negotiates a request's version. The protocol classes ``EndTxnRequest`` /
  ``EndTxnResponse`` (``kafka.protocol.producer.transaction``) and
  ``FindCoordinatorRequest`` / ``FindCoordinatorResponse`` / ``CoordinatorType``
  (``kafka.protocol.metadata``), built from Kafka's JSON schemas (their ``fields``).
  A connection carries at most ``max_in_flight_requests_per_connection`` requests
  at once (it refuses more with NodeNotReadyError "paused"), so at most that many
  EndTxn are in flight per coordinator.

No Airflow or PySpark imports: the modules it checks run in any worker that has kafka-python.
"""

from __future__ import annotations

import kafka
from kafka import KafkaAdminClient, KafkaProducer

from airflow_exactly_once.sinks.kafka.transaction_errors import KafkaInternalsChanged

KAFKA_PYTHON_VERSION_READ = "3.0.12"

__all__ = ["check_kafka_python_internals"]

# Fields of the protocol messages phase 2 builds and reads (kafka-python builds the classes from Kafka's schemas).
_PROTOCOL_FIELDS = {
    ("kafka.protocol.producer.transaction", "EndTxnRequest"): ("transactional_id", "producer_id", "producer_epoch",
                                                              "committed"),
    ("kafka.protocol.producer.transaction", "EndTxnResponse"): ("error_code",),
    ("kafka.protocol.metadata", "FindCoordinatorRequest"): ("key", "key_type", "coordinator_keys"),
    ("kafka.protocol.metadata", "FindCoordinatorResponse"): ("error_code", "node_id", "host", "port", "coordinators"),
}


def check_kafka_python_internals(producer: KafkaProducer | None = None, admin: KafkaAdminClient | None = None) -> None:
    """Raise `KafkaInternalsChanged` unless the kafka-python internals we use exist.

    Without arguments only the classes are checked; with `producer`, also the
    instance attributes of its TransactionManager (phase 1); with `admin`, the
    connection manager phase 2 sends its requests through.
    """
    problems: list[str] = []
    try:
        from kafka.producer import transaction_manager as tm_module
    except ImportError as exc:  # pragma: no cover - depends on the installed version
        raise KafkaInternalsChanged(internals_message([f"kafka.producer.transaction_manager: {exc}"])) from exc

    for name in ("TransactionManager", "TransactionState"):
        if not hasattr(tm_module, name):
            problems.append(f"kafka.producer.transaction_manager.{name}")
    state = getattr(tm_module, "TransactionState", None)
    if state is not None and not hasattr(state, "IN_TRANSACTION"):
        problems.append("TransactionState.IN_TRANSACTION")
    manager_cls = getattr(tm_module, "TransactionManager", None)
    if manager_cls is not None and not callable(getattr(manager_cls, "has_error", None)):
        problems.append("TransactionManager.has_error()")
    problems += _protocol_problems()

    if producer is not None:
        manager = getattr(producer, "_transaction_manager", None)
        if manager is None:
            problems.append("KafkaProducer._transaction_manager (is transactional_id set?)")
        else:
            for attr in ("_lock", "_current_state", "_transaction_started", "_partitions_in_transaction",
                         "_new_partitions_in_transaction", "_pending_partitions_in_transaction",
                         "producer_id_and_epoch", "transactional_id", "last_error"):
                if not hasattr(manager, attr):
                    problems.append(f"TransactionManager.{attr}")
    if admin is not None:
        manager = getattr(admin, "_manager", None)
        for method in ("run", "send"):
            if not callable(getattr(manager, method, None)):
                problems.append(f"KafkaAdminClient._manager.{method}()")
        if not callable(getattr(getattr(manager, "cluster", None), "add_coordinator", None)):
            problems.append("KafkaAdminClient._manager.cluster.add_coordinator()")
        if not callable(getattr(getattr(manager, "broker_version_data", None), "api_version", None)):
            problems.append("KafkaAdminClient._manager.broker_version_data.api_version()")
        for key in ("bootstrap_servers", "max_in_flight_requests_per_connection", "retry_backoff_ms",
                    "request_timeout_ms"):
            if key not in getattr(admin, "config", {}):
                problems.append(f"KafkaAdminClient.config[{key!r}]")
    if problems:
        raise KafkaInternalsChanged(internals_message(problems))


def _protocol_problems() -> list[str]:
    import importlib

    problems = []
    for (module_name, name), fields in _PROTOCOL_FIELDS.items():
        try:
            cls = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):
            problems.append(f"{module_name}.{name}")
            continue
        known = getattr(cls, "fields", None) or {}
        problems += [f"{name}.{f}" for f in fields if f not in known]
    try:
        from kafka.protocol.metadata import CoordinatorType

        CoordinatorType.TRANSACTION  # noqa: B018 - the attribute must exist
    except (ImportError, AttributeError):
        problems.append("kafka.protocol.metadata.CoordinatorType.TRANSACTION")
    return problems


def internals_message(problems: list[str]) -> str:
    return (
        f"{__name__} drives kafka-python internals read off "
        f"kafka-python {KAFKA_PYTHON_VERSION_READ}, but the installed kafka-python "
        f"{getattr(kafka, '__version__', '?')} lacks: {', '.join(problems)}. "
        f"Install kafka-python=={KAFKA_PYTHON_VERSION_READ} or adapt this module to the new internals."
    )
