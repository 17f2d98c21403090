"""Opt-in mirror of the committed offsets into a Kafka consumer group, for lag dashboards.

Flink commits offsets to Kafka after a checkpoint for monitoring only; this is the same.
The ledger stays the only source of truth: nothing ever reads these group offsets back,
and no consumer of this package auto-commits. A failed mirror is logged and recorded in
the ledger, never failing a batch that is already committed.
"""

from __future__ import annotations

import logging

from kafka import KafkaAdminClient, TopicPartition
from kafka.structs import OffsetAndMetadata

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.sources.kafka_offsets import consumer_config

log = logging.getLogger(__name__)


def mirror_committed_offsets(config: PipelineConfig, ledger: Ledger) -> str:
    """Write the ledger's committed positions to `config.mirror_consumer_group`; returns a log line."""
    group = config.mirror_consumer_group
    if not group:
        return "no mirror_consumer_group; consumer groups left alone"
    positions = ledger.committed_positions(config.pipeline_id)
    offsets = {TopicPartition(t, p): OffsetAndMetadata(o, f"airflow-exactly-once:{config.pipeline_id}", -1)
               for (t, p), o in sorted(positions.items())}
    settings = {k: v for k, v in consumer_config(config.kafka_config).items() if k in KafkaAdminClient.DEFAULT_CONFIG}
    try:
        admin = KafkaAdminClient(bootstrap_servers=config.bootstrap_servers, **settings)
        try:
            errors = {tp: err for tp, err in admin.alter_group_offsets(group, offsets).items()
                      if err.__name__ != "NoError"}
        finally:
            admin.close()
    except Exception as exc:
        errors = {"all partitions": exc}
    if errors:
        message = (f"could not mirror committed offsets to consumer group {group!r}: "
                   f"{', '.join(f'{tp}: {getattr(err, '__name__', err)}' for tp, err in errors.items())} "
                   "(a group with active members refuses offset changes; the ledger is unaffected)")
        log.warning(message)
        ledger.record_event(config.pipeline_id, None, "mirror-failed", message)
        return message
    return f"mirrored {len(offsets)} committed offsets to consumer group {group!r}"
