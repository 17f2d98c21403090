"""Opt-in mirror of the committed offsets into a Kafka consumer group, for lag dashboards.

Flink commits offsets to Kafka after a checkpoint for monitoring only; this is the same.
The ledger stays the only source of truth: nothing ever reads these group offsets back,
and no consumer of this package auto-commits. A failed mirror is logged and recorded in
the ledger, never failing a batch that is already committed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import kafka.errors as Errors
from kafka import KafkaAdminClient, TopicPartition
from kafka.structs import OffsetAndMetadata

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.observe.drift import GroupOffset, mirror_metadata
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.kafka.liveness import reachable
from airflow_exactly_once.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)


def _alter(settings: KafkaSettings, group: str, offsets: dict) -> dict:
    """Per-partition errors of one AlterOffsets attempt (an exception counts for all partitions)."""
    try:
        admin = KafkaAdminClient(**reachable(settings).kafka_python(KafkaAdminClient))
        try:
            return {tp: err for tp, err in admin.alter_group_offsets(group, offsets).items()
                    if err is not Errors.NoError}
        finally:
            admin.close()
    except Exception as exc:
        return {"all partitions": exc}


@dataclass(frozen=True)
class Mirrored:
    ok: bool
    message: str  # a log line


def mirror_committed_offsets(config: PipelineConfig, ledger: Ledger, timeout_s: float = 30.0,
                             settings: KafkaSettings | None = None) -> Mirrored:
    """Write the ledger's committed positions to `config.mirror_consumer_group`.

    `settings`: the Kafka to write to, when not the pipeline's own (the CLI's --kafka-conn-id)."""
    group = config.mirror_consumer_group
    if not group:
        return Mirrored(True, "no mirror_consumer_group; consumer groups left alone")
    positions = ledger.committed_positions(config.pipeline_id)
    offsets = {TopicPartition(t, p): OffsetAndMetadata(o, mirror_metadata(config.pipeline_id), -1)
               for (t, p), o in sorted(positions.items())}
    settings = settings or KafkaSettings.of(config)
    deadline = time.monotonic() + timeout_s
    while True:
        errors = _alter(settings, group, offsets)
        retriable = all(getattr(e, "retriable", False) for e in errors.values())
        if not errors or not retriable or time.monotonic() > deadline:
            break
        time.sleep(1)  # e.g. the group coordinator is still being created on first use
    if errors:
        problems = ", ".join(f"{tp}: {getattr(err, '__name__', err)}" for tp, err in errors.items())
        message = (f"could not mirror committed offsets to consumer group {group!r}: {problems} "
                   "(a group with active members refuses offset changes; the ledger is unaffected and the next "
                   "notify_complete mirrors again)")
        log.warning(message)
        ledger.record_event(config.pipeline_id, None, "mirror-failed", message)
        return Mirrored(False, message)
    return Mirrored(True, f"mirrored {len(offsets)} committed offsets to consumer group {group!r}")


def read_group_offsets(settings: KafkaSettings, group: str,
                       timeout_ms: int | None = None) -> dict[tuple[str, int], GroupOffset]:
    """Every offset `group` holds (the drift check compares them with the ledger); `timeout_ms` bounds the wait
    for the broker (the ledger page's)."""
    quick = {} if timeout_ms is None else {"request_timeout_ms": timeout_ms, "bootstrap_timeout_ms": timeout_ms}
    try:
        admin = KafkaAdminClient(**{**reachable(settings).kafka_python(KafkaAdminClient), **quick})
        try:
            held = admin.list_group_offsets({group: None})[group]
        finally:
            admin.close()
    except Exception as exc:
        raise ConfigurationError(f"could not read the offsets of consumer group {group!r} from Kafka at "
                                 f"{settings.bootstrap_servers} ({settings.origin}): {type(exc).__name__}: {exc}; "
                                 "check that the broker is reachable with these settings (--kafka-conn-id, "
                                 "--bootstrap-servers) and that they may DESCRIBE the group") from exc
    return {(tp.topic, tp.partition): GroupOffset(meta.offset, meta.metadata or "")
            for tp, meta in held.items() if meta.offset >= 0}
