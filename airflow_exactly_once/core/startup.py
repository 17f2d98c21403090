"""Where a partition starts when the ledger knows nothing about it (FlinkKafkaConsumer's startup modes).

Only partitions seen for the first time get here: the ledger's committed positions always
win, so changing `startup_mode` on a running pipeline changes nothing already recorded.
The first run uses `startup_mode`; partitions that appear later in a topic already read use
`new_partition_start`; a topic that a `topic_pattern` finds later starts at its earliest offset,
whatever the startup mode (as Flink's KafkaSource starts partitions it discovers): its records
were all written after the pipeline began, so starting anywhere else would skip data.
"""

from __future__ import annotations

from typing import Iterable

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.source import OffsetSource
from airflow_exactly_once.core.timestamps import iso, to_epoch_ms

TopicPartition = tuple[str, int]
Start = tuple[int, str]  # offset, and why (recorded in the ledger)
# The origin recorded for the partitions of a topic that topic_pattern found after the pipeline's first plan.
DISCOVERED_TOPIC = "discovered topic (topic_pattern), earliest"


def edge_start(mode: str, log_start: int, end: int) -> int:
    """earliest / latest: the log start or the last stable offset."""
    return log_start if mode == "earliest" else end


def startup_positions(config: PipelineConfig, source: OffsetSource, unknown: list[TopicPartition],
                      log_starts: dict[TopicPartition, int], ends: dict[TopicPartition, int],
                      first_run: bool, known_topics: Iterable[str] = ()) -> dict[TopicPartition, Start]:
    """Start offsets, with their origin, of partitions the ledger has never seen (`known_topics`: the topics it
    has seen)."""
    if not unknown:
        return {}
    if not first_run:
        known, mode = set(known_topics), config.new_partition_start
        return {tp: (edge_start(mode, log_starts[tp], ends[tp]), f"new partition, {mode}") if tp[0] in known
                else (log_starts[tp], DISCOVERED_TOPIC) for tp in unknown}
    mode = config.startup_mode
    if mode in ("earliest", "latest"):
        return {tp: (edge_start(mode, log_starts[tp], ends[tp]), f"startup mode {mode}") for tp in unknown}
    found: dict[TopicPartition, int | None]
    if mode == "timestamp":
        at = to_epoch_ms(config.startup_timestamp, "startup_timestamp (startup_mode='timestamp')")
        # No record at or after the time yet: start at the end, as Flink's TIMESTAMP mode does.
        found = {tp: offset if offset is not None else ends[tp]
                 for tp, offset in source.offsets_for_times(unknown, at).items()}
        how = f"startup mode timestamp {iso(at)}"
    elif mode == "specific_offsets":
        wanted = config.startup_offset_map()
        found = {tp: wanted.get(tp) for tp in unknown}
        how = "startup mode specific_offsets"
        for tp, offset in found.items():
            if offset is not None and offset > ends[tp]:
                raise ConfigurationError(
                    f"startup_offsets gives offset {offset} for {tp[0]}[{tp[1]}], beyond the end of the log "
                    f"({ends[tp]}); give an offset between {log_starts[tp]} and {ends[tp]}")
    else:  # group_offsets
        found = source.group_offsets(str(config.startup_group_id), unknown)
        how = f"committed offset of consumer group {config.startup_group_id!r}"
    fallback = config.startup_fallback
    starts = {}
    for tp in unknown:
        offset = found.get(tp)
        if offset is None:
            starts[tp] = (edge_start(fallback, log_starts[tp], ends[tp]), f"{how}: none for this partition, "
                                                                          f"startup_fallback {fallback}")
        else:
            starts[tp] = (offset, how)
    return starts
