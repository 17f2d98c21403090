"""The rate search's verdicts (benchmarks/bench_freshness_rate.py): pure arithmetic over what the consumer saw."""

from __future__ import annotations

from benchmarks.bench_freshness import Exactness, StreamResult, SteadyProducer, VisibilityConsumer
from benchmarks.bench_freshness_rate import best, judge, quarter_growth


def seen(latencies_ms: list[int]) -> tuple[VisibilityConsumer, SteadyProducer]:
    consumer = VisibilityConsumer("127.0.0.1:9", "out")
    producer = SteadyProducer("127.0.0.1:9", "in", 100, 1, first_id=10)
    producer.produced = len(latencies_ms)
    consumer.latency_ms = {10 + i: latency for i, latency in enumerate(latencies_ms)}
    return consumer, producer


def result(kept_up_with: float) -> StreamResult:
    return StreamResult("x", {"p50": 1.0}, 100, kept_up_with, kept_up_with, Exactness(100, 0, 0, 0))


def test_a_flat_latency_shows_no_growth_and_a_rising_one_shows_how_much():
    flat = seen([3000, 5000, 4000, 3000] * 25)
    assert abs(quarter_growth(*flat)) <= 1.0
    rising = seen([1000 + 200 * i for i in range(100)])  # 0.2 s more per record
    assert 4.0 <= quarter_growth(*rising) <= 16.0


def test_a_step_is_sustained_only_when_the_output_kept_up_and_the_latency_held():
    _, producer = seen([1000] * 100)
    producer.started_at, producer.ended_at = 100.0, 160.0  # 60 s, as planned
    producer.rate, producer.produced = 1000, 60_000
    assert judge(1000, result(990), 1.0, producer, 60, 5).sustained
    assert not judge(1000, result(800), 1.0, producer, 60, 5).sustained  # the output fell behind
    assert not judge(1000, result(990), 12.0, producer, 60, 5).sustained  # a backlog grew
    producer.ended_at = 190.0  # the producer needed 90 s for it: R was not offered in full
    step = judge(1000, result(660), 1.0, producer, 60, 5)
    assert step.producer_limited and step.sustained  # judged against what was offered (667/s)
    assert best([step, judge(2000, result(500), 9.0, producer, 60, 5)]) == 1000
