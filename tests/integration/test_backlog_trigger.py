"""The backlog trigger against the real broker and a real ledger, its run() driven as the triggerer drives it.

Batches are planned through the protocol (tests/harness.py with the real Kafka offsets; the
sink needs no Spark). Airflow's own triggerer running the trigger for an Asset watcher, and
the runs that follow: tests/system/test_backlog_runs.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer

from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.triggers.backlog import PipelineBacklogTrigger
from devtools.ports import reserve_port
from tests.harness import MarkerWriter, Pipe, open_ledger, pipeline_config
from tests.helpers import create_topic

POLL = 0.3


def send(bootstrap: str, topic: str, count: int, partitions: int = 3, timestamp_ms: int | None = None) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for i in range(count):
        producer.send(topic, value=f"v{i}".encode(), partition=i % partitions, timestamp_ms=timestamp_ms)
    producer.flush()
    producer.close()


class Watching:
    """A trigger's run() as the triggerer runs it: a task of the event loop, its events in a queue."""

    def __init__(self, trigger: PipelineBacklogTrigger) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.create_task(self._consume(trigger))

    async def _consume(self, trigger: PipelineBacklogTrigger) -> None:
        async for event in trigger.run():
            await self.queue.put(event.payload)

    async def event(self, timeout: float = 30.0) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            raise AssertionError(f"the trigger did not fire in {timeout:.0f}s") from None

    async def quiet(self, seconds: float) -> None:
        """No event for `seconds` (and the trigger still runs)."""
        try:
            payload = await asyncio.wait_for(self.queue.get(), seconds)
        except asyncio.TimeoutError:
            assert not self.task.done(), self.task.exception()
            return
        raise AssertionError(f"the trigger fired: {payload}")

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def trigger_for(pipe: Pipe, **kwargs: Any) -> PipelineBacklogTrigger:
    config = pipe.config
    return PipelineBacklogTrigger(**{
        "pipeline_id": config.pipeline_id, "topics": config.topics, "kafka_conn_id": None,
        "bootstrap_servers": config.bootstrap_servers, "ledger_url": str(pipe.ledger.engine.url),
        "poll_interval_seconds": POLL, "kafka_timeout_ms": 3000, **kwargs})


@pytest.fixture
def pipe(kafka, tmp_path, unique) -> Pipe:
    topic = f"backlog-{unique}"
    create_topic(kafka.bootstrap_servers, topic, partitions=3)
    config = pipeline_config(f"backlog-{unique}", [topic], {"type": "parquet", "path": str(tmp_path / "out")},
                             bootstrap=kafka.bootstrap_servers)
    ledger = open_ledger(tmp_path / "ledger.db")
    return Pipe(config, ledger, lambda: KafkaOffsetSource(KafkaSettings.of(config)), writer_factory=MarkerWriter.of)


def snapshot(pipe: Pipe) -> tuple:
    """Everything the ledger holds about the pipeline (to show the trigger changed nothing)."""
    ledger, pid = pipe.ledger, pipe.config.pipeline_id
    pipeline = ledger.pipeline(pid)
    return (pipeline and pipeline["epoch"], [(b.seq, b.state, b.epoch) for b in ledger.list_batches(pid)],
            len(ledger.list_events(pid, limit=10_000)), ledger.committed_positions(pid))


def consumer_groups(kafka) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        return {group["group_id"] if isinstance(group, dict) else group[0] for group in admin.list_groups()}
    finally:
        admin.close()


def test_fires_once_enough_records_wait_and_once_more_per_planned_batch(kafka, pipe):
    bootstrap, topic = kafka.bootstrap_servers, pipe.config.topics[0]
    groups_before = consumer_groups(kafka)

    async def scenario() -> None:
        watching = Watching(trigger_for(pipe, min_records=20))
        try:
            await watching.quiet(3)  # an empty topic and a pipeline that never ran: nothing waits
            await asyncio.to_thread(send, bootstrap, topic, 25)
            first = await watching.event()
            assert first["reason"] == "min_records" and first["waiting_records"] == 25
            assert first["pipeline_id"] == pipe.config.pipeline_id and first["ledger_batch"] == 0

            # More records before the run it asked for has planned: no second event (no pile-up).
            before = await asyncio.to_thread(snapshot, pipe)
            await asyncio.to_thread(send, bootstrap, topic, 30)
            await watching.quiet(3)
            assert await asyncio.to_thread(snapshot, pipe) == before  # it never wrote the ledger

            # That run plans all 55: in flight, they no longer wait, so nothing fires.
            batch = (await asyncio.to_thread(pipe.plan, "run-1")).batch
            assert batch.state is BatchState.PLANNED and batch.offset_span == 55
            await watching.quiet(3)

            # Records beyond the batch in flight: the next run is worth asking for.
            await asyncio.to_thread(send, bootstrap, topic, 20)
            second = await watching.event()
            assert second["waiting_records"] == 20 and second["ledger_batch"] == batch.seq

            # The first batch commits, the second run plans the 20: quiet again.
            await asyncio.to_thread(pipe.write, batch.id)
            await asyncio.to_thread(pipe.commit, batch.id)
            assert (await asyncio.to_thread(pipe.plan, "run-2")).batch.offset_span == 20
            await watching.quiet(2)
        finally:
            await watching.stop()

    asyncio.run(scenario())
    assert consumer_groups(kafka) == groups_before  # offsets only: no consumer group was used or committed


def test_a_few_records_fire_once_the_oldest_beyond_the_ledger_waited_max_wait(kafka, pipe):
    bootstrap, topic = kafka.bootstrap_servers, pipe.config.topics[0]
    now = int(time.time() * 1000)

    async def scenario() -> None:
        # Records stamped an hour ago, committed by a batch; then two stamped two minutes ago wait.
        await asyncio.to_thread(send, bootstrap, topic, 3, 3, now - 3_600_000)
        batch = (await asyncio.to_thread(pipe.plan, "run-1")).batch
        await asyncio.to_thread(pipe.write, batch.id)
        await asyncio.to_thread(pipe.commit, batch.id)
        await asyncio.to_thread(send, bootstrap, topic, 2, 3, now - 120_000)
        patient = Watching(trigger_for(pipe, min_records=1000, max_wait_seconds=600))
        try:
            await patient.quiet(3)  # the oldest waiting record is two minutes old (the hour-old ones are committed)
        finally:
            await patient.stop()
        eager = Watching(trigger_for(pipe, min_records=1000, max_wait_seconds=60))
        try:
            event = await eager.event()
            assert event["reason"] == "max_wait" and event["waiting_records"] == 2
        finally:
            await eager.stop()

    asyncio.run(scenario())


def test_a_broker_or_ledger_that_does_not_answer_is_reported_and_polled_again(kafka, pipe, tmp_path, capfd):
    closed_port = reserve_port()  # reserved, never listened on
    bootstrap, topic = kafka.bootstrap_servers, pipe.config.topics[0]
    broken_ledger = tmp_path / "broken-ledger.db"
    broken_ledger.write_text("this is not a database")

    async def scenario() -> None:
        no_broker = Watching(trigger_for(pipe, bootstrap_servers=f"127.0.0.1:{closed_port}",
                                         kafka_timeout_ms=1000))
        no_ledger = Watching(trigger_for(pipe, ledger_url=f"sqlite:///{broken_ledger}", min_records=1))
        try:
            await no_broker.quiet(6)  # several polls, each failing; the trigger keeps running
            await no_ledger.quiet(2)
            # The ledger becomes readable: the trigger notices and fires for the records waiting.
            await asyncio.to_thread(send, bootstrap, topic, 4)
            broken_ledger.unlink()
            open_ledger(broken_ledger).ensure_pipeline(pipe.config.pipeline_id, "fp", {})
            event = await no_ledger.event()
            assert event["waiting_records"] == 4
        finally:
            await no_broker.stop()
            await no_ledger.stop()

    asyncio.run(scenario())
    # The trigger logs like every Airflow component (structlog, to the triggerer's output).
    output = capfd.readouterr()
    ours = [line for line in (output.out + output.err).splitlines() if "PipelineBacklogTrigger" in line]
    errors = [line for line in ours if "[error" in line]
    broker_errors = [line for line in errors if f"127.0.0.1:{closed_port}" in line]
    ledger_errors = [line for line in errors if "not a database" in line]
    # Reported once per distinct error, not at every poll.
    assert len(broker_errors) == 1 and "cannot tell whether records wait" in broker_errors[0], errors
    assert len(ledger_errors) == 1, errors
    assert any("answer again" in line for line in ours)
