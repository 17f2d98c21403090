"""The demo's own Kafka clients (devtools/demo.py) against the real broker: they produce and read the input and
close without an error line, which `make demo` would print after its verification line. The whole demo:
`make demo`; the rule alone: tests/unit/test_devtools.py.
"""

from __future__ import annotations

import logging
import time

from kafka import KafkaConsumer, TopicPartition

from devtools import demo


def kafka_errors(caplog) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records
            if r.name.startswith("kafka") and r.levelno >= logging.ERROR]


def test_the_demos_kafka_clients_read_what_they_wrote_and_close_without_an_error(kafka, unique, monkeypatch,
                                                                                   caplog):
    monkeypatch.setattr(demo, "TOPIC", f"demo-events-{unique}")
    with caplog.at_level(logging.INFO, logger="kafka"):
        demo.produce_events(kafka.bootstrap_servers, 300, 4, 3)
        good, bad = demo.read_input(kafka.bootstrap_servers)
    assert sum(good.values()) == 300 and set(good) == set(range(300)) and sum(bad.values()) == 4
    assert kafka_errors(caplog) == []
    assert any(r.name.startswith("kafka") for r in caplog.records)  # kafka-python's records do reach this check


def test_a_consumer_closed_with_its_metadata_refresh_in_flight_logs_no_error(kafka, unique, monkeypatch, caplog):
    """A new consumer asks for its topic's metadata about retry_backoff_ms (100 ms) after assign: closed around
    then, kafka-python's close cancels that request and, with a plain close(), logs "Metadata refresh: failed
    Cancelled" or "Connection lost" at ERROR (7 of 8 closes at 100 ms when measured). Closed as the demo closes
    them, at delays around it: no error."""
    topic = f"demo-close-{unique}"
    monkeypatch.setattr(demo, "TOPIC", topic)
    demo.produce_events(kafka.bootstrap_servers, 10, 0, 1)
    with caplog.at_level(logging.INFO, logger="kafka"):
        for step in range(16):
            consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, enable_auto_commit=False)
            consumer.assign([TopicPartition(topic, 0)])
            time.sleep(0.06 + 0.005 * step)
            demo.close_kafka_clients(consumer)
    assert kafka_errors(caplog) == []
    assert any(r.name == "kafka.cluster" for r in caplog.records)  # its refreshes ran (logged at INFO)
