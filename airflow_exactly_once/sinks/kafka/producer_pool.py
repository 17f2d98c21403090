"""AT_LEAST_ONCE and NONE producers kept in the executor's Python worker from one Spark task to the next.

A Python worker runs many tasks in a row (spark.python.worker.reuse, Spark's default), and Spark keeps one
producer per executor for its own Kafka writer. A new idempotent producer waits for its producer id before
its first record leaves (the largest fixed cost of a task: docs/benchmarks.md) and learns the cluster
again; a kept one does neither. A task borrows the producer of its settings and gives it back only after
every record it sent was acknowledged (flushed, no delivery error): a producer that failed, or that
reported a fatal error while it was idle, is closed and never lent again. Not for EXACTLY_ONCE: a
transactional id names one Spark partition of one batch.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import time
from typing import Any, Callable, Iterator

import confluent_kafka

from airflow_exactly_once.sinks.kafka import librdkafka

# How long an idle producer is kept (Spark's own: spark.kafka.producer.cache.timeout, 10 minutes). Spark also
# ends Python workers idle for a minute, and their producers with them.
IDLE_S = 600.0

Report = Callable[[Any, Any], None]


class _Reports:
    """A kept producer's callbacks: delivery errors go to the task that borrowed it; a fatal error marks it
    unusable, also while it is idle."""

    def __init__(self) -> None:
        self.borrower: Report | None = None
        self.fatal: Any = None

    def delivery(self, error: Any, message: Any) -> None:
        if self.borrower is not None:
            self.borrower(error, message)

    def error(self, error: Any) -> None:
        if error.fatal():
            self.fatal = error


_kept: dict[str, tuple[confluent_kafka.Producer, _Reports, float]] = {}


@contextlib.contextmanager
def borrowed(settings: dict[str, Any], guarantee: str, on_delivery: Report | None) -> Iterator[confluent_kafka.Producer]:
    """A producer for `guarantee` (AT_LEAST_ONCE or NONE) reporting failed records to `on_delivery`; kept for
    the next task only when the block ends without an exception."""
    if guarantee not in ("AT_LEAST_ONCE", "NONE"):
        raise ValueError(f"only AT_LEAST_ONCE and NONE producers are kept between tasks, not {guarantee}")
    key = json.dumps([guarantee, settings], sort_keys=True, default=str)
    _close_idle(time.monotonic())
    kept = _take(key)
    if kept is None:
        reports = _Reports()
        producer = librdkafka.new_producer({**settings, "error_cb": reports.error}, guarantee,
                                           on_delivery=reports.delivery, report_successes=False)
    else:
        producer, reports = kept
    reports.borrower = on_delivery
    try:
        yield producer
    except BaseException:
        _close(producer)
        raise
    finally:
        reports.borrower = None
    if reports.fatal is None:
        _kept[key] = (producer, reports, time.monotonic())
    else:
        _close(producer)


def _take(key: str) -> tuple[confluent_kafka.Producer, _Reports] | None:
    """The kept producer of `key` and its reports, unless it failed while idle."""
    kept = _kept.pop(key, None)
    if kept is None:
        return None
    producer, reports, _ = kept
    producer.poll(0)  # serve what happened while it was idle
    if reports.fatal is not None:
        _close(producer)
        return None
    return producer, reports


def _close_idle(now: float) -> None:
    for key, (producer, _, since) in list(_kept.items()):
        if now - since > IDLE_S:
            del _kept[key]
            _close(producer)


def _close(producer: confluent_kafka.Producer) -> None:
    """Best effort: drop what is still queued and close (never raises over the error that got us here)."""
    try:
        producer.purge()
        producer.close()
    except (confluent_kafka.KafkaException, RuntimeError):
        pass


@atexit.register
def close_all() -> None:
    """Close every kept producer: at the interpreter's exit (a driver or test process that wrote records itself;
    Spark ends its workers without it), and for tests."""
    while _kept:
        _close(_kept.popitem()[1][0])


def kept_producers() -> int:
    """How many producers this process keeps (tests, diagnostics)."""
    return len(_kept)
