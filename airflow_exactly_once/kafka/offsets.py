"""The planner's view of Kafka, through kafka-python on the Airflow worker (the driver).

A failure says what to fix when it can (kafka.access: a refused login, an untrusted
certificate or a missing ACL is a ConfigurationError, never retried); the first broker is
awaited for PROBE_BOOTSTRAP_TIMEOUT_MS unless the settings give bootstrap.timeout.ms, so a plan
against servers that refuse or do not answer fails in seconds, not minutes. The consumer bootstraps
from a server that answers, and a question that met a node that died a moment ago (still in the
cluster's metadata until the controller fences it) is asked again for up to the request timeout
(kafka.liveness): one node of a cluster away is no reason to fail a plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, TypeVar

from kafka import KafkaAdminClient, KafkaConsumer
from kafka import TopicPartition as KafkaTP
from kafka.errors import KafkaError

from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError, SourceUnavailableError
from airflow_exactly_once.core.ranges import start_of_waiting
from airflow_exactly_once.core.topics import partitions_to_read
from airflow_exactly_once.kafka.access import PROBE_BOOTSTRAP_TIMEOUT_MS, explain_failure
from airflow_exactly_once.kafka.liveness import ask_around, reachable
from airflow_exactly_once.kafka.settings import KafkaSettings

TopicPartition = tuple[str, int]
Answer = TypeVar("Answer")

# The shortest gap kafka-python keeps between two metadata requests of the planner's consumer (see prompt_metadata).
METADATA_REFRESH_GAP_MS = 10


class KafkaOffsetSource:
    """Partitions and offsets of the source topics (read_committed), with the pipeline's client settings."""

    def __init__(self, settings: KafkaSettings, timeout_ms: int = 15_000, bootstrap_timeout_ms: int | None = None
                 ) -> None:
        """`bootstrap_timeout_ms`: how long to wait for a first broker (default: PROBE_BOOTSTRAP_TIMEOUT_MS, then
        the connection's bootstrap.timeout.ms wins); readers that must answer quickly when the broker is down
        (the ledger page, the backlog trigger) shorten it."""
        self.settings = settings
        self.bootstrap_servers = settings.bootstrap_servers
        self.timeout_ms = timeout_ms
        self._topics: list[str] = []
        wait = PROBE_BOOTSTRAP_TIMEOUT_MS if bootstrap_timeout_ms is None else bootstrap_timeout_ms
        quick = {"bootstrap_timeout_ms": wait} if "bootstrap_timeout_ms" in KafkaConsumer.DEFAULT_CONFIG else {}
        try:
            self._consumer = KafkaConsumer(**{"request_timeout_ms": timeout_ms, **quick,
                                              **reachable(settings).kafka_python(KafkaConsumer),
                                              "enable_auto_commit": False, "isolation_level": "read_committed"})
        except KafkaError as exc:
            raise self._failure(exc, "connecting to Kafka to plan the batch") from exc
        prompt_metadata(self._consumer)

    def _failure(self, exc: Exception, doing: str) -> ExactlyOnceError:
        return explain_failure(self.settings, exc, doing, SourceUnavailableError, topics=self._topics)

    def _ask(self, what: str, question: Callable[[], Answer]) -> Answer:
        """`question()`, asked again while a node that went away does not answer, for up to the request timeout."""
        return ask_around(what, question, patience_s=self.timeout_ms / 1000)

    def partitions(self, topics: list[str]) -> list[TopicPartition]:
        found: list[TopicPartition] = []
        self._topics = list(topics)
        try:
            existing = self._ask("listing topics", self._consumer.topics)
            for topic in topics:
                ids = self._consumer.partitions_for_topic(topic) if topic in existing else None
                if not ids:
                    raise ConfigurationError(
                        f"Kafka topic {topic!r} does not exist on {self.bootstrap_servers}: create it, or fix "
                        f"the topic name in the pipeline{self._unless_hidden()}")
                found.extend((topic, p) for p in sorted(ids))
        except KafkaError as exc:
            raise self._failure(exc, f"listing partitions of {topics}") from exc
        return found

    def cluster_partitions(self) -> dict[str, list[int]]:
        # One metadata request for every topic (kafka-python's topics() always asks the cluster, internal topics
        # left out); the partitions then come from the metadata it cached.
        try:
            existing = self._ask("listing topics", self._consumer.topics)
            return {topic: sorted(self._consumer.partitions_for_topic(topic) or ()) for topic in existing}
        except KafkaError as exc:
            raise self._failure(exc, "listing the cluster's topics (topic_pattern)") from exc

    def _unless_hidden(self) -> str:
        if self.settings.security_protocol.startswith("SASL"):  # brokers hide topics a user may not DESCRIBE
            return (f" (or grant {self.settings.principal} of {self.settings.origin} READ and DESCRIBE on it: the "
                    "brokers hide topics a user may not describe)")
        return ""

    def log_start_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return self._offsets("beginning_offsets", tps)

    def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        # read_committed: end_offsets returns the last stable offset, so an open
        # transaction's records are never planned into a batch.
        return self._offsets("end_offsets", tps)

    def offsets_for_times(self, tps: list[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int | None]:
        # Under read_committed the broker only answers offsets below the last stable offset.
        try:
            answer = self._ask("asking for offsets by time", lambda: self._consumer.offsets_for_times(
                {KafkaTP(t, p): int(timestamp_ms) for t, p in tps}, timeout_ms=self.timeout_ms))
        except KafkaError as exc:
            raise self._failure(exc, f"asking Kafka for the offsets at time {timestamp_ms}") from exc
        return {(tp.topic, tp.partition): (None if found is None else found.offset) for tp, found in answer.items()}

    def group_offsets(self, group_id: str, tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        try:
            admin = KafkaAdminClient(**{"request_timeout_ms": self.timeout_ms,
                                        "bootstrap_timeout_ms": PROBE_BOOTSTRAP_TIMEOUT_MS,
                                        **reachable(self.settings).kafka_python(KafkaAdminClient)})
            try:
                answer = admin.list_group_offsets({group_id: [KafkaTP(t, p) for t, p in tps]})[group_id]
            finally:
                admin.close()
        except KafkaError as exc:
            raise self._failure(exc, f"reading the committed offsets of consumer group {group_id!r}") from exc
        found = {(tp.topic, tp.partition): meta.offset for tp, meta in answer.items()}
        return {tp: (found[tp] if found.get(tp, -1) >= 0 else None) for tp in tps}

    def _offsets(self, method: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        try:
            answer = self._ask(method, lambda: getattr(self._consumer, method)([KafkaTP(t, p) for t, p in tps],
                                                                               timeout_ms=self.timeout_ms))
        except KafkaError as exc:
            raise self._failure(exc, f"asking Kafka for {method.replace('_', ' ')}") from exc
        return {(tp.topic, tp.partition): offset for tp, offset in answer.items()}

    def close(self) -> None:
        self._consumer.close()


def prompt_metadata(consumer: KafkaConsumer) -> bool:
    """Let the consumer ask for topic metadata right after its bootstrap; False when kafka-python has changed.

    kafka-python 3.0 builds a client's ClusterMetadata without the client's retry_backoff_ms, so the refresh that
    `topics()` asks for waits the default 100 ms after the bootstrap's (which asks for no topic): half of a plan
    of 12 partitions, for nothing. Planning is one short-lived consumer, a handful of requests; the gap only
    spaces out refreshes (KIP-580's backoff for an unreachable broker is kept apart, in the connection delay).
    setup.cfg pins kafka-python to 3.0.x; tests/integration/test_planning_kafka.py fails when this no longer
    applies.
    """
    config = getattr(getattr(consumer, "_cluster", None), "config", None)
    if not isinstance(config, dict) or "retry_backoff_ms" not in config:
        return False
    config["retry_backoff_ms"] = min(config["retry_backoff_ms"], METADATA_REFRESH_GAP_MS)
    return True


@dataclass(frozen=True)
class TopicOffsets:
    """Kafka's side of a pipeline's backlog, read with offset requests only (no records, no consumer group)."""

    last_stable: dict[TopicPartition, int]
    log_start: dict[TopicPartition, int]
    # offsets_for_times(cutoff) of the partitions with records waiting (only when a cutoff was asked for)
    first_at_cutoff: dict[TopicPartition, int | None] = field(default_factory=dict)


def read_topic_offsets(source: KafkaOffsetSource, topics: list[str], *,
                       positions: Mapping[TopicPartition, int] | None = None,
                       cutoff_ms: int | None = None, pattern: str | None = None) -> TopicOffsets:
    """Last stable offsets and log starts of `topics` (or of every topic `pattern` matches now, new ones included);
    with `cutoff_ms`, where that time falls in the partitions holding records beyond `positions` (to tell how old
    the oldest waiting record is)."""
    tps = partitions_to_read(source, topics, pattern)
    last_stable, log_start = source.end_offsets(tps), source.log_start_offsets(tps)
    first_at_cutoff: dict[TopicPartition, int | None] = {}
    if cutoff_ms is not None:
        waiting = [tp for tp in tps if last_stable[tp] > start_of_waiting(tp, positions or {}, log_start)]
        if waiting:
            first_at_cutoff = source.offsets_for_times(waiting, cutoff_ms)
    return TopicOffsets(last_stable, log_start, first_at_cutoff)
