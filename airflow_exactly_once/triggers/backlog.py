"""Event-driven runs: a trigger that fires when records wait in a pipeline's topics beyond its ledger.

Used as the trigger of an AssetWatcher (Airflow 3's event-driven scheduling), so a DAG
scheduled on that Asset runs when there is data instead of on a clock:

    backlog = PipelineBacklogTrigger(pipeline_id="orders", topics=["orders"], min_records=1000,
                                     max_wait_seconds=300)

A pipeline over `topic_pattern` gives the trigger the same pattern: each poll lists the topics
that match then, so a topic created since the last batch counts as waiting from its log start
(where the next plan starts it).
    with DAG(..., schedule=[pipeline_backlog_asset("orders", backlog)], max_active_runs=1): ...

It fires when the topics hold at least `min_records` committed records (read_committed:
below the last stable offset) beyond the ledger's position, or when the oldest of them is
older than `max_wait_seconds`. "Beyond the ledger's position" counts from the committed
position or from the end of a batch in flight, whichever is further, so records a running
batch already took do not ask for another run.

It only reads: offsets from Kafka (ListOffsets: last stable offsets, log starts and
offsets_for_times; no records are fetched and no consumer group is used or committed) and
the ledger through a read-only connection. It never moves the ledger.

One event per run, not one per poll: after firing it waits until the ledger holds a batch
newer than the newest one it saw (the run it started has planned), or until `rearm_seconds`
passed without one (the DAG was paused, or the run failed before planning). With the DAG's
`max_active_runs=1`, records arriving during a running batch lead to one more run, not a
queue of them: the event comes at the first poll after the running batch planned, and Airflow holds it (the
Asset's queue) until that run ends, so the next run is created at the scheduler's next loop instead of a poll
later. The memory lives in the running trigger: if the triggerer restarts while a run
it asked for is still queued, the new trigger may ask once more (that run plans what is left,
or records an EMPTY batch).

A ledger or broker that does not answer never ends the trigger: it logs the error (once per
distinct error, in the triggerer's log) and tries again at every poll.

Every poll also sends the pipeline's metrics through Airflow's metrics layer
(airflow_exactly_once.airflow_integration.metrics): the lag per partition, under the same name and tags as the plan
step's, and the batches in flight with the oldest PREPARED one against its sink's commit deadline,
so that those gauges stay fresh between runs.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, AsyncIterator

from asgiref.sync import sync_to_async

from airflow_exactly_once.airflow_integration.compat import BaseEventTrigger, TriggerEvent
from airflow_exactly_once.airflow_integration.metrics import PipelineMetrics
from airflow_exactly_once.observe.backlog import (
    IN_FLIGHT,
    InFlightSummary,
    WakeGate,
    WakeRule,
    claimed_positions,
    waited_too_long,
    waiting_records,
)
from airflow_exactly_once.core.ledger import Ledger, missing_sqlite_file
from airflow_exactly_once.core.timestamps import iso, now_ms
from airflow_exactly_once.core.topics import compile_topic_pattern
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource, read_topic_offsets

__all__ = ["PipelineBacklogTrigger"]

TopicPartition = tuple[str, int]
# The default poll. A poll costs about 17 ms of wall time and 8 ms of CPU in the triggerer (load 7 on 2 cores) and
# three requests to Kafka (metadata, two ListOffsets; a third with max_wait_seconds) and four ledger reads
# (docs/benchmarks.md, freshness): a triggerer carrying 100 pipelines spends about 0.16 of a core on them. Under a
# steady load the poll after a run planned fires for the next one, which Airflow holds until the running one ends
# (max_active_runs=1), so a poll shorter than a run adds nothing; an idle pipeline's first record waits one poll.
DEFAULT_POLL_SECONDS = 5.0


@dataclass
class Backlog:
    """What one poll saw."""

    waiting: dict[TopicPartition, int]
    aged: list[TopicPartition]
    last_seq: int
    last_stable: dict[TopicPartition, int]
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    in_flight: InFlightSummary | None = None  # None: the ledger does not know the pipeline yet

    @property
    def total(self) -> int:
        return sum(self.waiting.values())


class _Probe:
    """The blocking reads of one poll (run in a worker thread): the ledger, then Kafka's offsets."""

    def __init__(self, trigger: "PipelineBacklogTrigger") -> None:
        self.trigger = trigger
        self._ledger: Ledger | None = None
        self._ledger_url: str | None = None
        self._source: KafkaOffsetSource | None = None
        self._deadline: tuple[str, int | None] | None = None  # (pipeline fingerprint, the sink's commit deadline)

    def _commit_deadline_ms(self, stored: dict) -> int | None:
        """The pipeline's sink's commit deadline, worked out again only when its configuration changed."""
        from airflow_exactly_once.sinks import stored_commit_deadline_ms

        key = str(stored.get("fingerprint"))
        if self._deadline is None or self._deadline[0] != key:
            self._deadline = (key, stored_commit_deadline_ms(stored.get("config") or {}))
        return self._deadline[1]

    def _positions(self) -> tuple[dict[TopicPartition, int], int, InFlightSummary | None]:
        """Where the next batch would start (committed, or past a batch in flight), the newest batch number, and
        the batches in flight."""
        from airflow_exactly_once.hooks.ledger import LedgerHook

        if self._ledger_url is None:
            hook = LedgerHook(ledger_conn_id=self.trigger.ledger_conn_id, ledger_url=self.trigger.ledger_url)
            # The triggerer's own embedded file is not the one tasks on other machines would write: refused like them
            # (logged at every distinct error, never firing on a position it cannot know).
            hook.check_placement()
            self._ledger_url = hook.get_url()
        if missing_sqlite_file(self._ledger_url):  # the embedded ledger before any pipeline ran
            return {}, 0, None
        if self._ledger is None:
            self._ledger = Ledger.read_only(self._ledger_url)
        ledger, pipeline_id = self._ledger, self.trigger.pipeline_id
        stored = ledger.pipeline(pipeline_id) if ledger.has_schema() else None
        if stored is None:
            return {}, 0, None
        flying = ledger.list_batches(pipeline_id, IN_FLIGHT)
        in_flight = None
        with self.trigger.metrics().reporting("batches in flight"):  # for the metrics only: never fails the poll
            in_flight = InFlightSummary.read(flying, datetime.now(timezone.utc), self._commit_deadline_ms(stored))
        return (claimed_positions(ledger.committed_positions(pipeline_id), flying), ledger.last_batch_seq(pipeline_id),
                in_flight)

    def read(self, cutoff_ms: int | None) -> Backlog:
        from airflow_exactly_once.hooks.kafka import source_kafka_settings

        positions, last_seq, in_flight = self._positions()
        if self._source is None:
            settings = source_kafka_settings(self.trigger.kafka_conn_id, self.trigger.kafka_config,
                                             self.trigger.bootstrap_servers).check()
            self._source = KafkaOffsetSource(settings, timeout_ms=self.trigger.kafka_timeout_ms,
                                             bootstrap_timeout_ms=self.trigger.kafka_timeout_ms)
        offsets = read_topic_offsets(self._source, list(self.trigger.topics), positions=positions, cutoff_ms=cutoff_ms,
                                     pattern=self.trigger.topic_pattern)
        backlog = Backlog(waiting_records(positions, offsets.last_stable, offsets.log_start),
                          waited_too_long(positions, offsets.last_stable, offsets.log_start, offsets.first_at_cutoff),
                          last_seq, offsets.last_stable, positions, in_flight)
        self.report(backlog)
        return backlog

    def report(self, backlog: Backlog) -> None:
        """The poll's metrics (here, in the worker thread: the first send may resolve the metrics host)."""
        metrics = self.trigger.metrics()
        with metrics.reporting("backlog"):
            metrics.lag(backlog.waiting)
            if backlog.in_flight is not None:
                metrics.in_flight(backlog.in_flight)

    def close(self) -> None:
        """Drop the clients (after an error, the next poll connects anew)."""
        source, self._source = self._source, None
        if source is not None:
            try:
                source.close()
            except Exception:  # noqa: BLE001 - closing a broken client must not hide the error being handled
                pass
        ledger, self._ledger = self._ledger, None
        if ledger is not None:
            ledger.engine.dispose()


class PipelineBacklogTrigger(BaseEventTrigger):
    """Fires when a pipeline's topics hold `min_records` records beyond its ledger, or the oldest waits too long.

    :param pipeline_id: The pipeline whose ledger position counts (the DAG's exactly_once_batch pipeline_id).
    :param topics: Its Kafka topic(s).
    :param topic_pattern: Instead of topics: the pipeline's topic_pattern (every matching topic counts, new ones too).
    :param kafka_conn_id: The official `kafka` connection (bootstrap servers and security in its extra).
    :param kafka_config: Client settings over the connection's (librdkafka names), as the pipeline's.
    :param bootstrap_servers: Servers instead of the connection's.
    :param ledger_conn_id: The ledger's connection, as the pipeline's (default: the embedded SQLite file).
    :param ledger_url: The ledger's SQLAlchemy URL, instead of ledger_conn_id.
    :param min_records: Fire when at least this many committed records wait beyond the ledger.
    :param max_wait_seconds: Also fire when fewer wait but the oldest is older than this (by its Kafka
        timestamp); None: wait for min_records only.
    :param poll_interval_seconds: How often to look (each look is a few offset requests and ledger reads;
        DEFAULT_POLL_SECONDS says what a look costs).
    :param rearm_seconds: After firing, how long to wait for the run to plan before asking again.
    :param kafka_timeout_ms: How long one request to Kafka may take.
    """

    def __init__(self, *, pipeline_id: str, topics: list[str] | str | None = None, topic_pattern: str | None = None,
                 kafka_conn_id: str | None = "kafka_default",
                 kafka_config: dict[str, Any] | None = None, bootstrap_servers: str | None = None,
                 ledger_conn_id: str | None = None, ledger_url: str | None = None, min_records: int = 1,
                 max_wait_seconds: float | None = None, poll_interval_seconds: float = DEFAULT_POLL_SECONDS,
                 rearm_seconds: float = 900.0, kafka_timeout_ms: int = 10_000) -> None:
        super().__init__()
        self.pipeline_id = pipeline_id
        self.topics = [topics] if isinstance(topics, str) else list(topics or ())
        self.topic_pattern = topic_pattern or None
        self.kafka_conn_id = kafka_conn_id
        self.kafka_config = dict(kafka_config or {})
        self.bootstrap_servers = bootstrap_servers
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.min_records = min_records
        self.max_wait_seconds = max_wait_seconds
        self.poll_interval_seconds = float(poll_interval_seconds)
        self.rearm_seconds = float(rearm_seconds)
        self.kafka_timeout_ms = int(kafka_timeout_ms)
        self.rule = WakeRule(min_records, None if max_wait_seconds is None else int(max_wait_seconds * 1000)).validate()
        if bool(self.topics) == bool(self.topic_pattern):
            raise ValueError("PipelineBacklogTrigger needs the pipeline's topics or its topic_pattern (one of them)")
        if self.topic_pattern:
            compile_topic_pattern(self.topic_pattern)
        if self.poll_interval_seconds <= 0:
            raise ValueError("poll_interval_seconds must be positive")

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "pipeline_id": self.pipeline_id, "topics": self.topics, "topic_pattern": self.topic_pattern,
            "kafka_conn_id": self.kafka_conn_id,
            "kafka_config": self.kafka_config, "bootstrap_servers": self.bootstrap_servers,
            "ledger_conn_id": self.ledger_conn_id, "ledger_url": self.ledger_url, "min_records": self.min_records,
            "max_wait_seconds": self.max_wait_seconds, "poll_interval_seconds": self.poll_interval_seconds,
            "rearm_seconds": self.rearm_seconds, "kafka_timeout_ms": self.kafka_timeout_ms,
        })

    def metrics(self) -> PipelineMetrics:
        """The pipeline's metrics, the same names and tags as its steps send (airflow_integration/metrics.py)."""
        if "_metrics" not in self.__dict__:
            self._metrics = PipelineMetrics(self.pipeline_id, logger=self.log)
        return self._metrics

    def _cutoff_ms(self) -> int | None:
        return None if self.rule.max_wait_ms is None else now_ms() - self.rule.max_wait_ms

    def _payload(self, reason: str, backlog: Backlog) -> dict[str, Any]:
        def tp(key: TopicPartition) -> str:
            return f"{key[0]}:{key[1]}"

        return {
            "pipeline_id": self.pipeline_id, "reason": reason, "waiting_records": backlog.total,
            "min_records": self.min_records, "max_wait_seconds": self.max_wait_seconds,
            "waiting": {tp(k): v for k, v in sorted(backlog.waiting.items()) if v},
            "last_stable_offsets": {tp(k): v for k, v in sorted(backlog.last_stable.items())},
            "ledger_batch": backlog.last_seq, "at": iso(now_ms()),
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        probe = _Probe(self)
        gate = WakeGate(self.rearm_seconds)
        # The SDK's connection lookup inside the triggerer must run under sync_to_async (not a plain thread).
        read = sync_to_async(probe.read, thread_sensitive=False)
        problem: str | None = None
        seen: tuple[int, int] | None = None
        self.log.info("watching pipeline %s (topics %s): fires at %d waiting records%s", self.pipeline_id,
                      ", ".join(self.topics) or f"matching {self.topic_pattern!r}", self.min_records,
                      f" or after {self.max_wait_seconds:g} s" if self.max_wait_seconds else "")
        try:
            while True:
                try:
                    backlog = await read(self._cutoff_ms())
                except Exception as exc:  # noqa: BLE001 - a watcher that ends stops event-driven runs unseen
                    # Expected: ExactlyOnceError (settings, a missing topic), SQLAlchemyError (the ledger),
                    # KafkaError / OSError (the broker); anything else (a missing connection) is reported alike.
                    message = f"{type(exc).__name__}: {exc}".splitlines()[0][:1000]
                    if message != problem:
                        self.log.error("pipeline %s: cannot tell whether records wait (%s); trying again every %g s",
                                       self.pipeline_id, message, self.poll_interval_seconds)
                        problem = message
                    await sync_to_async(probe.close, thread_sensitive=False)()
                    await asyncio.sleep(self.poll_interval_seconds)
                    continue
                if problem is not None:
                    self.log.info("pipeline %s: the ledger and Kafka answer again", self.pipeline_id)
                    problem = None
                if seen != (backlog.total, backlog.last_seq):
                    self.log.info("pipeline %s: %d records wait beyond the ledger (newest batch %d)",
                                  self.pipeline_id, backlog.total, backlog.last_seq)
                    seen = (backlog.total, backlog.last_seq)
                reason = self.rule.reason(backlog.total, bool(backlog.aged))
                if gate.open(backlog.last_seq, time.monotonic()) and reason is not None:
                    self.log.info("pipeline %s: firing (%s): %d records wait", self.pipeline_id, reason, backlog.total)
                    yield TriggerEvent(self._payload(reason, backlog))
                    gate.fired(backlog.last_seq, time.monotonic())
                await asyncio.sleep(self.poll_interval_seconds)
        finally:
            await sync_to_async(probe.close, thread_sensitive=False)()
