"""The AT_LEAST_ONCE / NONE producers a Python worker keeps between Spark tasks (sinks.kafka.producer_pool)."""

from __future__ import annotations

import pytest

from airflow_exactly_once.sinks.kafka import producer_pool


class FakeError:
    def __init__(self, fatal: bool) -> None:
        self._fatal = fatal

    def fatal(self) -> bool:
        return self._fatal


class FakeProducer:
    """Records what the pool does with it; `poll` serves the callbacks queued with `happen`."""

    def __init__(self, config: dict) -> None:
        self.config, self.closed, self.pending = config, False, []

    def happen(self, callback, *args) -> None:
        self.pending.append((callback, args))

    def poll(self, timeout: float) -> int:
        served, self.pending = self.pending, []
        for callback, args in served:
            callback(*args)
        return len(served)

    def purge(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def made(monkeypatch) -> list[FakeProducer]:
    producers: list[FakeProducer] = []

    def new_producer(settings, guarantee, transactional_id=None, transaction_timeout_ms=None, on_delivery=None,
                     report_successes=True):
        assert transactional_id is None and not report_successes  # only failed records are reported
        producers.append(FakeProducer({**settings, "guarantee": guarantee, "on_delivery": on_delivery}))
        return producers[-1]

    monkeypatch.setattr(producer_pool.librdkafka, "new_producer", new_producer)
    monkeypatch.setattr(producer_pool, "_kept", {})
    return producers


SETTINGS = {"bootstrap.servers": "127.0.0.1:9092"}


def test_a_producer_is_lent_again_to_the_next_task_with_the_same_settings(made):
    with producer_pool.borrowed(SETTINGS, "AT_LEAST_ONCE", None) as first:
        pass
    with producer_pool.borrowed(dict(SETTINGS), "AT_LEAST_ONCE", None) as second:
        assert second is first
    with producer_pool.borrowed(SETTINGS, "NONE", None) as other_guarantee:
        assert other_guarantee is not first
    with producer_pool.borrowed({**SETTINGS, "linger.ms": 5}, "AT_LEAST_ONCE", None) as other_settings:
        assert other_settings not in (first, other_guarantee)
    assert len(made) == 3 and producer_pool.kept_producers() == 3 and not any(p.closed for p in made)


def test_a_task_that_failed_closes_its_producer_and_the_next_gets_a_new_one(made):
    with pytest.raises(RuntimeError):
        with producer_pool.borrowed(SETTINGS, "AT_LEAST_ONCE", None):
            raise RuntimeError("a record was not acknowledged")
    assert made[0].closed and producer_pool.kept_producers() == 0
    with producer_pool.borrowed(SETTINGS, "AT_LEAST_ONCE", None) as producer:
        assert producer is made[1]


def test_delivery_errors_reach_only_the_task_that_borrowed_the_producer(made):
    first_task, second_task = [], []
    with producer_pool.borrowed(SETTINGS, "AT_LEAST_ONCE", lambda e, m: first_task.append(e)) as producer:
        producer.config["on_delivery"]("failed", None)
    producer.config["on_delivery"]("late, while idle", None)  # nobody borrows it: dropped
    with producer_pool.borrowed(SETTINGS, "AT_LEAST_ONCE", lambda e, m: second_task.append(e)):
        producer.config["on_delivery"]("failed again", None)
    assert (first_task, second_task) == (["failed"], ["failed again"])


def test_a_producer_that_turned_fatal_while_idle_is_closed_not_lent(made):
    with producer_pool.borrowed(SETTINGS, "AT_LEAST_ONCE", None) as producer:
        pass
    producer.happen(producer.config["error_cb"], FakeError(fatal=False))  # e.g. a broker went away for a while
    with producer_pool.borrowed(SETTINGS, "AT_LEAST_ONCE", None) as again:
        assert again is producer
    producer.happen(producer.config["error_cb"], FakeError(fatal=True))  # served by the next borrow's poll
    with producer_pool.borrowed(SETTINGS, "AT_LEAST_ONCE", None) as fresh:
        assert fresh is not producer and producer.closed


def test_a_fatal_error_during_the_task_keeps_the_producer_from_being_kept(made):
    with producer_pool.borrowed(SETTINGS, "AT_LEAST_ONCE", None) as producer:
        producer.config["error_cb"](FakeError(fatal=True))
    assert producer.closed and producer_pool.kept_producers() == 0


def test_producers_idle_longer_than_spark_keeps_its_own_are_closed(made, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(producer_pool.time, "monotonic", lambda: clock[0])
    with producer_pool.borrowed(SETTINGS, "AT_LEAST_ONCE", None) as old:
        pass
    clock[0] += producer_pool.IDLE_S + 1
    with producer_pool.borrowed(SETTINGS, "NONE", None):
        pass
    assert old.closed and producer_pool.kept_producers() == 1


def test_transactional_producers_are_never_kept(made):
    with pytest.raises(ValueError, match="not EXACTLY_ONCE"):
        with producer_pool.borrowed(SETTINGS, "EXACTLY_ONCE", None):
            pass


def test_close_all_closes_every_kept_producer(made):
    for guarantee in ("AT_LEAST_ONCE", "NONE"):
        with producer_pool.borrowed(SETTINGS, guarantee, None):
            pass
    producer_pool.close_all()
    assert producer_pool.kept_producers() == 0 and all(p.closed for p in made)
