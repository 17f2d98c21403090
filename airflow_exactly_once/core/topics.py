"""Which topics a pipeline reads: an explicit list, or every topic whose name matches a pattern.

A pattern is matched against the whole topic name (Java's `Matcher.matches()`, as Spark's
`subscribePattern` and Flink's `KafkaSource.setTopicPattern` do it), so `orders\\..*` matches
`orders.eu` but not `old.orders.eu`. Internal topics (`__consumer_offsets`, `__transaction_state`,
any name starting with `__`) never match: their records are the cluster's, not data.

The pattern is resolved on the driver at each plan, against one listing of the cluster's topics;
the batch's ranges then name the topics it read, and nothing downstream (the write, the commit,
lineage, the UI) looks at the pattern again.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.source import OffsetSource

TopicPartition = tuple[str, int]
INTERNAL_PREFIX = "__"


def compile_topic_pattern(pattern: str) -> re.Pattern[str]:
    """The pattern, compiled; a ConfigurationError saying what is wrong when it is not a regular expression."""
    if not isinstance(pattern, str) or not pattern:
        raise ConfigurationError(f"topic_pattern={pattern!r}: give a regular expression matched against whole "
                                 "topic names, e.g. 'orders\\\\..*'")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigurationError(f"topic_pattern={pattern!r} is not a valid regular expression ({exc}); it is "
                                 "matched against whole topic names, e.g. 'orders\\\\..*' for orders.eu, "
                                 "orders.us") from exc


def matching_topics(pattern: str, names: Iterable[str]) -> list[str]:
    """The names that `pattern` matches as a whole, internal topics left out, sorted."""
    compiled = compile_topic_pattern(pattern)
    return sorted(n for n in set(names) if not n.startswith(INTERNAL_PREFIX) and compiled.fullmatch(n))


def matched_partitions(pattern: str, cluster: Mapping[str, Iterable[int]], where: str) -> list[TopicPartition]:
    """Every partition of the cluster's topics that `pattern` matches; `cluster` maps each topic to its partitions.

    A pattern that matches nothing is an error at plan, not an empty batch: a typo in the pattern or a wrong
    cluster would otherwise look like a quiet pipeline for as long as nobody checks. `where` names the cluster.
    """
    topics = matching_topics(pattern, cluster)
    if not topics:
        shown = sorted(n for n in cluster if not n.startswith(INTERNAL_PREFIX))
        listing = ", ".join(shown[:20]) + (f" and {len(shown) - 20} more" if len(shown) > 20 else "")
        raise ConfigurationError(
            f"topic_pattern {pattern!r} matches no topic on {where} (it must match a whole name; topics "
            f"starting with '__' never match). Topics there: {listing or 'none'}. Create a matching topic, or fix "
            "the pattern")
    return [(topic, partition) for topic in topics for partition in sorted(cluster[topic])]


def topics_of(tps: Iterable[TopicPartition]) -> list[str]:
    """The topics of some partitions (a batch's ranges, positions), sorted, each once."""
    return sorted({topic for topic, _ in tps})


def partitions_to_read(source: OffsetSource, topics: list[str], pattern: str | None = None,
                       where: str = "the Kafka cluster") -> list[TopicPartition]:
    """The partitions a plan reads now: those of the listed topics (each must exist), or of every topic `pattern`
    matches on the cluster at this moment."""
    if pattern is None:
        return source.partitions(topics)
    return matched_partitions(pattern, source.cluster_partitions(), where)
