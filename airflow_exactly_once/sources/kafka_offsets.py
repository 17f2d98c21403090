"""The planner's view of Kafka, through kafka-python on the Airflow worker (the driver)."""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError, SourceUnavailableError

TopicPartition = tuple[str, int]

# Settings that would let a consumer move offsets on its own; the ledger owns offsets.
_FORBIDDEN = {"enable_auto_commit", "group_id", "isolation_level"}
# Connection settings an admin client (used to read a group's offsets) understands too.
_ADMIN_SETTINGS = {"security_protocol", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password",
                   "ssl_check_hostname", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
                   "sasl_kerberos_service_name", "sasl_oauth_token_provider", "client_id"}


def consumer_config(kafka_config: dict[str, Any]) -> dict[str, Any]:
    """kafka-python keyword arguments from user settings (dots or underscores accepted)."""
    config = {key.replace(".", "_"): value for key, value in (kafka_config or {}).items()}
    bad = _FORBIDDEN & set(config)
    if bad:
        raise ConfigurationError(
            f"kafka_config must not set {', '.join(sorted(bad))}: the ledger owns offsets and reads are "
            "always read_committed; remove them")
    return config


class KafkaOffsetSource:
    def __init__(self, bootstrap_servers: str, kafka_config: dict[str, Any] | None = None,
                 timeout_ms: int = 15_000) -> None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError

        self.bootstrap_servers = bootstrap_servers
        self.kafka_config = dict(kafka_config or {})
        self.timeout_ms = timeout_ms
        try:
            self._consumer = KafkaConsumer(
                bootstrap_servers=bootstrap_servers,
                enable_auto_commit=False,
                isolation_level="read_committed",
                request_timeout_ms=timeout_ms,
                **consumer_config(kafka_config or {}),
            )
        except KafkaError as exc:
            raise SourceUnavailableError(
                f"no Kafka broker answered at {bootstrap_servers!r} ({type(exc).__name__}: {exc}): check that the "
                "broker is running and that bootstrap_servers (or the kafka connection's 'bootstrap.servers' "
                "extra) is right") from exc

    def partitions(self, topics: list[str]) -> list[TopicPartition]:
        from kafka.errors import KafkaError

        found: list[TopicPartition] = []
        try:
            existing = self._consumer.topics()
            for topic in topics:
                ids = self._consumer.partitions_for_topic(topic) if topic in existing else None
                if not ids:
                    raise ConfigurationError(
                        f"Kafka topic {topic!r} does not exist on {self.bootstrap_servers}: create it, or fix "
                        "the topic name in the pipeline")
                found.extend((topic, p) for p in sorted(ids))
        except KafkaError as exc:
            raise SourceUnavailableError(f"listing partitions of {topics} failed: {exc}") from exc
        return found

    def log_start_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return self._offsets("beginning_offsets", tps)

    def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        # read_committed: end_offsets returns the last stable offset, so an open
        # transaction's records are never planned into a batch.
        return self._offsets("end_offsets", tps)

    def offsets_for_times(self, tps: list[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int | None]:
        # Under read_committed the broker only answers offsets below the last stable offset.
        from kafka import TopicPartition as KafkaTP
        from kafka.errors import KafkaError

        try:
            answer = self._consumer.offsets_for_times({KafkaTP(t, p): int(timestamp_ms) for t, p in tps},
                                                      timeout_ms=self.timeout_ms)
        except KafkaError as exc:
            raise SourceUnavailableError(f"asking Kafka for the offsets at time {timestamp_ms} failed: {exc}") from exc
        return {(tp.topic, tp.partition): (None if found is None else found.offset) for tp, found in answer.items()}

    def group_offsets(self, group_id: str, tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        from kafka import KafkaAdminClient
        from kafka import TopicPartition as KafkaTP
        from kafka.errors import KafkaError

        settings = {k: v for k, v in consumer_config(self.kafka_config).items() if k in _ADMIN_SETTINGS}
        try:
            admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers, request_timeout_ms=self.timeout_ms,
                                     **settings)
            try:
                answer = admin.list_group_offsets({group_id: [KafkaTP(t, p) for t, p in tps]})[group_id]
            finally:
                admin.close()
        except KafkaError as exc:
            raise SourceUnavailableError(f"reading the committed offsets of consumer group {group_id!r} failed: "
                                         f"{exc}") from exc
        found = {(tp.topic, tp.partition): meta.offset for tp, meta in answer.items()}
        return {tp: (found[tp] if found.get(tp, -1) >= 0 else None) for tp in tps}

    def _offsets(self, method: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        from kafka import TopicPartition as KafkaTP
        from kafka.errors import KafkaError

        try:
            answer = getattr(self._consumer, method)([KafkaTP(t, p) for t, p in tps], timeout_ms=self.timeout_ms)
        except KafkaError as exc:
            raise SourceUnavailableError(f"asking Kafka for {method.replace('_', ' ')} failed: {exc}") from exc
        return {(tp.topic, tp.partition): offset for tp, offset in answer.items()}

    def close(self) -> None:
        self._consumer.close()
