"""What the ledger page and the arrival trigger read: a pipeline's batches, positions and backlog.

Pure arithmetic over what the ledger says (batches, committed positions) and what the caller
read from Kafka (last stable offsets, log starts, offsets for a time), so the page's lag and
the trigger's "records waiting" are the same numbers. Nothing here writes the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import Batch, OffsetRange
from airflow_exactly_once.core.ranges import start_of_waiting
from airflow_exactly_once.core.retention import Retention
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.topics import topics_of

TopicPartition = tuple[str, int]
IN_FLIGHT = (BatchState.PLANNED, BatchState.PREPARED)
# Events the page highlights: decisions that moved data or positions on purpose or by recovery.
NOTABLE_EVENTS = frozenset({"data-loss-skipped", "data-loss-skip", "rewind", "recovered", "recovery-lost",
                            "superseded", "replaced", "aborted"})


def utc(moment: datetime | None) -> datetime | None:
    """An aware UTC datetime (SQLite hands the ledger's timestamps back without their zone)."""
    if moment is None:
        return None
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


@dataclass(frozen=True)
class BatchView:
    """One batch as the page shows it."""

    seq: int
    run_id: str
    state: BatchState
    epoch: int
    ranges: tuple[OffsetRange, ...]
    input_records: int | None
    output_records: int | None
    created_at: datetime | None
    updated_at: datetime | None
    error: str | None

    @classmethod
    def of(cls, batch: Batch) -> "BatchView":
        return cls(batch.seq, batch.run_id, batch.state, batch.epoch, batch.ranges, batch.input_records,
                   batch.output_records, utc(batch.created_at), utc(batch.updated_at), batch.error)

    @property
    def duration_s(self) -> float | None:
        """Planned to finished; None while in flight (its age is shown instead)."""
        if self.state in IN_FLIGHT or self.created_at is None or self.updated_at is None:
            return None
        return max(0.0, (self.updated_at - self.created_at).total_seconds())


@dataclass(frozen=True)
class InFlightView:
    """A PLANNED or PREPARED batch, its age, and how long its sink keeps the staged output."""

    seq: int
    run_id: str
    state: BatchState
    age_s: float
    deadline_s: float | None  # the sink's commit deadline (Kafka: transaction_timeout_ms); None: none

    @property
    def remaining_s(self) -> float | None:
        return None if self.deadline_s is None else self.deadline_s - self.age_s

    @property
    def overdue(self) -> bool:
        """Past the deadline: the sink has likely dropped the output and the batch will be processed again."""
        return self.remaining_s is not None and self.remaining_s <= 0


@dataclass(frozen=True)
class PartitionLag:
    """A partition's committed position against Kafka's last stable offset."""

    topic: str
    partition: int
    committed: int | None  # None: the ledger has no position yet (the pipeline never ran on it)
    in_flight_end: int | None
    last_stable: int | None
    log_start: int | None

    @property
    def lag(self) -> int | None:
        """Committed records (Kafka read_committed) not yet committed by the pipeline.

        An upper bound: transaction markers take offsets too. Counted from the log start when
        the position lies below it (those records are gone).
        """
        if self.last_stable is None:
            return None
        start = self.committed if self.committed is not None else self.log_start or 0
        if self.log_start is not None:
            start = max(start, self.log_start)
        return max(0, self.last_stable - start)

    @property
    def below_log_start(self) -> bool:
        """Records between the position and the log start were deleted (retention): data loss ahead."""
        return self.committed is not None and self.log_start is not None and self.committed < self.log_start


@dataclass(frozen=True)
class ChartPoint:
    seq: int
    at: datetime | None
    records: int | None
    duration_s: float | None


@dataclass
class PipelineReport:
    """Everything the ledger says about one pipeline, as of `now`."""

    pipeline_id: str
    epoch: int
    config: dict[str, Any]
    batches: list[BatchView]
    in_flight: list[InFlightView]
    events: list[dict[str, Any]]
    committed: dict[TopicPartition, int]
    claimed: dict[TopicPartition, int]
    counts: dict[str, int]
    chart: list[ChartPoint]
    last_seq: int
    now: datetime
    commit_deadline_ms: int | None = None
    dag_ids: set[str] = field(default_factory=set)
    pruned_through: int = 0  # retention pruned the batches up to this one (0: none)

    @property
    def retention(self) -> str:
        """The pipeline's retention and how far it has pruned, as the page says it."""
        said = Retention.stored(self.config).describe()
        return f"{said}; pruned up to batch {self.pruned_through}" if self.pruned_through else said

    @property
    def topics(self) -> list[str]:
        """The topics the pipeline has read: those of its positions and of its batches' ranges (a topic_pattern's
        matches as the plans found them), else the configured list."""
        read = topics_of([*self.committed, *self.claimed, *((r.topic, r.partition) for b in self.batches
                                                             for r in b.ranges)])
        return read or list(self.config.get("topics") or [])

    @property
    def topic_pattern(self) -> str | None:
        return self.config.get("topic_pattern") or None

    @property
    def reads(self) -> str:
        """What the pipeline reads, as the page and the CLI say it: the pattern and what it matched, or the topics."""
        if self.topic_pattern is None:
            return ", ".join(self.topics)
        return f"{self.topic_pattern} (matched: {', '.join(self.topics) or 'nothing planned yet'})"

    @property
    def sink_type(self) -> str:
        return str((self.config.get("sink") or {}).get("type") or "?")

    @property
    def last_commit_at(self) -> datetime | None:
        committed = [b.updated_at for b in self.batches if b.state is BatchState.COMMITTED and b.updated_at]
        return max(committed) if committed else None


def claimed_positions(committed: Mapping[TopicPartition, int],
                      in_flight: Iterable[Batch | BatchView]) -> dict[TopicPartition, int]:
    """Where the next batch would start: the committed position, or past a batch already in flight."""
    positions = dict(committed)
    for batch in in_flight:
        for r in batch.ranges:
            tp = (r.topic, r.partition)
            positions[tp] = max(positions.get(tp, r.end), r.end)
    return positions


def read_pipeline(ledger: Ledger, pipeline_id: str, *, now: datetime | None = None,
                  commit_deadline_ms: int | None = None, batch_limit: int = 50, event_limit: int = 50,
                  chart_limit: int = 50) -> PipelineReport | None:
    """The page's view of a pipeline (None if the ledger does not know it); reads only."""
    pipeline = ledger.pipeline(pipeline_id)
    if pipeline is None:
        return None
    now = utc(now) or datetime.now(timezone.utc)
    batches = [BatchView.of(b) for b in ledger.list_batches(pipeline_id, limit=batch_limit)]
    flying = ledger.list_batches(pipeline_id, IN_FLIGHT, newest_first=False)
    in_flight = in_flight_views(flying, now, commit_deadline_ms)
    committed = ledger.committed_positions(pipeline_id)
    chart = [ChartPoint(b.seq, utc(b.updated_at), b.output_records, BatchView.of(b).duration_s)
             for b in reversed(ledger.list_batches(pipeline_id, [BatchState.COMMITTED], limit=chart_limit))]
    return PipelineReport(
        pipeline_id=pipeline_id, epoch=pipeline["epoch"], config=pipeline["config"], batches=batches,
        in_flight=in_flight, events=ledger.list_events(pipeline_id, limit=event_limit), committed=committed,
        claimed=claimed_positions(committed, flying), counts=ledger.state_counts(pipeline_id), chart=chart,
        last_seq=ledger.last_batch_seq(pipeline_id), now=now, commit_deadline_ms=commit_deadline_ms,
        pruned_through=ledger.retention_floor(pipeline_id).batch_seq)


def in_flight_views(batches: Iterable[Batch], now: datetime, commit_deadline_ms: int | None) -> list[InFlightView]:
    """The PLANNED and PREPARED ones of `batches`, aged from when they were planned (an upper bound of how long a
    transaction the write opened has been open)."""
    deadline_s = None if commit_deadline_ms is None else commit_deadline_ms / 1000
    return [InFlightView(b.seq, b.run_id, b.state, max(0.0, (now - (utc(b.created_at) or now)).total_seconds()),
                         deadline_s) for b in batches if b.state in IN_FLIGHT]


@dataclass(frozen=True)
class InFlightSummary:
    """What alerts need of the batches in flight: how many, and how close the oldest PREPARED one is to its
    sink's commit deadline (past it, the sink has likely dropped the output and the batch is processed again)."""

    planned: int
    prepared: int
    oldest_prepared_age_s: float | None  # None: no PREPARED batch
    deadline_s: float | None  # the sink's commit deadline; None: it has none

    @classmethod
    def of(cls, views: Iterable[InFlightView], deadline_s: float | None) -> "InFlightSummary":
        views = list(views)
        prepared = [v.age_s for v in views if v.state is BatchState.PREPARED]
        return cls(sum(v.state is BatchState.PLANNED for v in views), len(prepared),
                   max(prepared) if prepared else None, deadline_s)

    @classmethod
    def read(cls, batches: Iterable[Batch], now: datetime, commit_deadline_ms: int | None) -> "InFlightSummary":
        return cls.of(in_flight_views(batches, now, commit_deadline_ms),
                      None if commit_deadline_ms is None else commit_deadline_ms / 1000)

    @property
    def total(self) -> int:
        return self.planned + self.prepared

    @property
    def remaining_s(self) -> float | None:
        """Seconds until the oldest PREPARED batch reaches the deadline (the whole deadline when none is PREPARED;
        negative: overdue); None when the sink has no deadline."""
        if self.deadline_s is None:
            return None
        return self.deadline_s - (self.oldest_prepared_age_s or 0.0)

    @property
    def deadline_used(self) -> float | None:
        """The oldest PREPARED batch's age as a share of the deadline (0: none PREPARED, 1: at the deadline)."""
        if not self.deadline_s:
            return None
        return (self.oldest_prepared_age_s or 0.0) / self.deadline_s


def partition_lags(committed: Mapping[TopicPartition, int], claimed: Mapping[TopicPartition, int],
                   last_stable: Mapping[TopicPartition, int], log_start: Mapping[TopicPartition, int]
                   ) -> list[PartitionLag]:
    """One row per partition known to the ledger or to Kafka."""
    rows = []
    for tp in sorted(set(committed) | set(last_stable)):
        end = claimed.get(tp)
        rows.append(PartitionLag(tp[0], tp[1], committed.get(tp),
                                 end if end is not None and end != committed.get(tp) else None,
                                 last_stable.get(tp), log_start.get(tp)))
    return rows


# -- the arrival trigger -------------------------------------------------------------


def waiting_records(positions: Mapping[TopicPartition, int], last_stable: Mapping[TopicPartition, int],
                    log_start: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Committed records beyond the ledger's position (and beyond batches in flight), per partition.

    An upper bound, like the lag: transaction markers take offsets too.
    """
    return {tp: max(0, lso - start_of_waiting(tp, positions, log_start)) for tp, lso in last_stable.items()}


def waited_too_long(positions: Mapping[TopicPartition, int], last_stable: Mapping[TopicPartition, int],
                    log_start: Mapping[TopicPartition, int],
                    first_at_cutoff: Mapping[TopicPartition, int | None]) -> list[TopicPartition]:
    """Partitions whose oldest waiting record is older than the cutoff time.

    `first_at_cutoff` is Kafka's offsets_for_times(cutoff): the first offset whose timestamp is
    at or after the cutoff (None: no such record below the last stable offset). If that offset
    is past the first waiting one, the first waiting record is older than the cutoff.
    """
    aged = []
    for tp, lso in last_stable.items():
        start = start_of_waiting(tp, positions, log_start)
        if lso <= start or tp not in first_at_cutoff:
            continue
        found = first_at_cutoff[tp]
        if found is None or found > start:
            aged.append(tp)
    return sorted(aged)


@dataclass(frozen=True)
class WakeRule:
    """When records waiting beyond the ledger are worth a run."""

    min_records: int = 1
    max_wait_ms: int | None = None

    def validate(self) -> "WakeRule":
        if isinstance(self.min_records, bool) or not isinstance(self.min_records, int) or self.min_records < 1:
            raise ConfigurationError(f"min_records={self.min_records!r} must be a whole number >= 1 (records "
                                     "waiting beyond the ledger's position before a run starts)")
        if self.max_wait_ms is not None and (isinstance(self.max_wait_ms, bool) or self.max_wait_ms <= 0):
            raise ConfigurationError(f"max_wait={self.max_wait_ms!r} ms must be positive, or None to wait for "
                                     "min_records only")
        return self

    def reason(self, waiting: int, aged: bool) -> str | None:
        """Why to wake the pipeline now ("min_records", "max_wait"), or None."""
        if waiting >= self.min_records:
            return "min_records"
        if waiting > 0 and aged and self.max_wait_ms is not None:
            return "max_wait"
        return None


@dataclass
class WakeGate:
    """The trigger's memory between polls: one event per run, not one per poll.

    After an event the trigger stays quiet until the ledger holds a batch newer than the
    newest one it saw when it fired (the run it started has planned, so its range counts
    as in flight), or until `rearm_s` passed without one (that run never came: the DAG is
    paused, or the run failed before planning).
    """

    rearm_s: float
    awaiting_after_seq: int | None = None
    fired_at_s: float | None = None

    def open(self, last_seq: int, now_s: float) -> bool:
        if self.awaiting_after_seq is None:
            return True
        if last_seq > self.awaiting_after_seq or now_s - (self.fired_at_s or now_s) >= self.rearm_s:
            self.awaiting_after_seq = self.fired_at_s = None
            return True
        return False

    def fired(self, last_seq: int, now_s: float) -> None:
        self.awaiting_after_seq, self.fired_at_s = last_seq, now_s
