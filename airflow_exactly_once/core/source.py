"""What the planner needs to know about the source, and nothing more.

The real implementation asks Kafka with kafka-python; unit tests of the planner use a
fake with the same answers.
"""

from __future__ import annotations

from typing import Protocol

TopicPartition = tuple[str, int]


class OffsetSource(Protocol):
    def partitions(self, topics: list[str]) -> list[TopicPartition]:
        """All partitions of the topics, discovered now (raises if a topic does not exist)."""

    def cluster_partitions(self) -> dict[str, list[int]]:
        """Every topic the client may describe, with its partitions, from one metadata request (topic_pattern)."""

    def log_start_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The first offset still in the log (moves with retention and deletion)."""

    def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The last stable offset: nothing at or past it is committed yet."""

    def offsets_for_times(self, tps: list[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int | None]:
        """Per partition, the first offset whose record timestamp is >= timestamp_ms (None: no such record yet)."""

    def group_offsets(self, group_id: str, tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The consumer group's committed offset per partition (None: the group committed nothing there)."""

    def close(self) -> None:
        ...
