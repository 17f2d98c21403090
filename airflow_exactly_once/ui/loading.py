"""What the ledger page reads: the ledger (read-only), Kafka's offsets and the drift check's sources, each failure
kept as a message.

A ledger or broker that does not answer must not break the page (nor the api-server that
serves it): every read here turns the failure into text that the page shows in place of
the data it could not get.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from kafka.errors import KafkaError

from airflow_exactly_once.observe.backlog import PartitionLag, PipelineReport, partition_lags, read_pipeline
from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.observe.drift import DriftReport, check_drift, mirror_command
from airflow_exactly_once.core.errors import ExactlyOnceError, LedgerVersionError
from airflow_exactly_once.core.ledger import Ledger, missing_sqlite_file, redacted_url
from airflow_exactly_once.core.lineage_names import pipeline_asset_uri
from airflow_exactly_once.kafka.consumer_group import read_group_offsets
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource, read_topic_offsets
from airflow_exactly_once.sinks import stored_commit_deadline_ms as commit_deadline_ms

DEFAULT_KAFKA_TIMEOUT_MS = 5_000


class LedgerUnavailable(Exception):
    """The ledger could not be read; the message says which one and why."""


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:500]


@dataclass
class PipelineSummary:
    pipeline_id: str
    epoch: int
    counts: dict[str, int]
    updated_at: datetime | None
    dag_ids: set[str] = field(default_factory=set)


@dataclass
class LagResult:
    """Per-partition lag, or why Kafka could not be asked (the rows then hold the ledger's positions only)."""

    rows: list[PartitionLag]
    servers: str = ""
    error: str | None = None

    @property
    def total(self) -> int | None:
        if self.error is not None or any(r.lag is None for r in self.rows):
            return None
        return sum(r.lag or 0 for r in self.rows)


class LedgerReader:
    """The ledger the page shows, opened read-only (SQLite: the file must exist; PostgreSQL: read-only sessions)."""

    def __init__(self, url: str, description: str | None = None, warning: str | None = None) -> None:
        """`description`: which ledger this is, as the page names it (default: the URL without its password);
        `warning`: why the pipelines' tasks may not write to this ledger (the page shows it above everything)."""
        self.url = url
        self.description = description or redacted_url(url)
        self.warning = warning
        self._ledger: Ledger | None = None

    def _open(self) -> Ledger:
        if self._ledger is None:
            try:
                self._ledger = Ledger.read_only(self.url)
            except (ExactlyOnceError, sa.exc.SQLAlchemyError, ValueError) as exc:
                raise LedgerUnavailable(f"the ledger {self.description} cannot be opened: {_first_line(exc)}") from exc
        return self._ledger

    def read(self, what: str, reader: Any) -> Any:
        """`reader(ledger)`, with any database failure turned into LedgerUnavailable; None on an empty ledger."""
        if missing_sqlite_file(self.url):  # the embedded ledger before the first pipeline ran
            return None
        ledger = self._open()
        try:
            if not ledger.has_schema():
                return None
            return reader(ledger)
        except LedgerVersionError as exc:  # older or newer than this code: the page never migrates it
            raise LedgerUnavailable(f"the ledger {self.description} cannot be read by this provider: {exc}") from exc
        except sa.exc.SQLAlchemyError as exc:
            raise LedgerUnavailable(f"the ledger {self.description} did not answer while reading {what}: "
                                    f"{_first_line(exc)}") from exc

    def pipelines(self) -> list[PipelineSummary]:
        """Every pipeline with its batch counts and recorded DAGs ([] before the first pipeline ran)."""
        def read(ledger: Ledger) -> list[PipelineSummary]:
            dags = ledger.pipeline_dags()
            return [PipelineSummary(p["pipeline_id"], p["epoch"], ledger.state_counts(p["pipeline_id"]),
                                    p["updated_at"], dags.get(p["pipeline_id"], set()))
                    for p in ledger.list_pipelines()]
        return self.read("its pipelines", read) or []

    def run_ids(self, pipeline_id: str) -> set[str]:
        return self.read(f"the runs of {pipeline_id}", lambda ledger: ledger.run_ids(pipeline_id)) or set()

    def report(self, pipeline_id: str, *, now: datetime | None = None) -> PipelineReport | None:
        def read(ledger: Ledger) -> PipelineReport | None:
            stored = ledger.pipeline(pipeline_id)
            if stored is None:
                return None
            report = read_pipeline(ledger, pipeline_id, now=now or datetime.now(timezone.utc),
                                   commit_deadline_ms=commit_deadline_ms(stored["config"]))
            if report is not None:
                report.dag_ids = ledger.pipeline_dags().get(pipeline_id, set())
            return report
        return self.read(f"pipeline {pipeline_id}", read)


@dataclass
class DriftResult:
    """The drift check's report, and why a part of it could not be read (shown in its place)."""

    report: DriftReport | None
    errors: list[str] = field(default_factory=list)


# The page compares the Asset events of the batches it shows (the report's 50 newest): a constant cost per view,
# whatever the history's length; `airflow-exactly-once check` compares every kept batch.
DRIFT_BATCHES = 50
# And it reads at most this many events (the newest), also when Airflow holds more since the window began than those
# batches explain (another ledger's events, e.g. the page reads a stale ledger): each costs the view a little.
DRIFT_EVENTS = 1000


def read_drift(reader: LedgerReader, report: PipelineReport, session: Any,
               timeout_ms: int = DEFAULT_KAFKA_TIMEOUT_MS) -> DriftResult:
    """The ledger against the mirrored consumer group (with the pipeline's Kafka settings, as the lag) and the
    Asset events in Airflow's database (the api-server's session), as `airflow-exactly-once check` compares."""
    from airflow_exactly_once.airflow_integration.asset_history import recorded_batch_events  # Airflow: its database
    from airflow_exactly_once.hooks.kafka import stored_pipeline_kafka_settings  # Airflow: the connection

    pid = report.pipeline_id
    errors: list[str] = []

    def read_group(group: str) -> dict | None:
        try:
            settings = stored_pipeline_kafka_settings(PipelineConfig.from_dict(report.config))
            return read_group_offsets(settings, group, timeout_ms)
        except (ExactlyOnceError, KafkaError, OSError, ValueError, TypeError) as exc:
            errors.append(f"consumer group {group!r}: {_first_line(exc)}")
            return None

    def read_events(since: datetime | None) -> list | None:
        try:
            found = recorded_batch_events(pid, session, since, newest=DRIFT_EVENTS)
        except ExactlyOnceError as exc:
            errors.append(_first_line(exc))
            return None
        if len(found) == DRIFT_EVENTS:
            errors.append(f"the Asset events of {pipeline_asset_uri(pid)} older than its newest {DRIFT_EVENTS:,} "
                          f"(recorded since {since or 'ever'}): the page reads no more per view (older batches may "
                          f"show as missing); `airflow-exactly-once check {pid}` compares them all")
        return found

    try:
        found = reader.read(f"the drift of {pid}", lambda ledger: check_drift(
            ledger, pid, read_group=read_group, read_events=read_events, asset_uri=pipeline_asset_uri(pid),
            mirror_command=mirror_command(pid), newest_batches=DRIFT_BATCHES))
    except LedgerUnavailable as exc:
        return DriftResult(None, [str(exc)])
    return DriftResult(found, errors)


def read_lag(report: PipelineReport, timeout_ms: int = DEFAULT_KAFKA_TIMEOUT_MS) -> LagResult:
    """The ledger's positions against the topics' last stable offsets, read with the pipeline's Kafka settings."""
    from airflow_exactly_once.hooks.kafka import stored_pipeline_kafka_settings  # Airflow: the connection

    ledger_only = partition_lags(report.committed, report.claimed, {}, {})
    servers = str(report.config.get("bootstrap_servers") or "")
    try:
        settings = stored_pipeline_kafka_settings(PipelineConfig.from_dict(report.config))
        servers = settings.bootstrap_servers
        source = KafkaOffsetSource(settings, timeout_ms=timeout_ms, bootstrap_timeout_ms=timeout_ms)
        try:
            offsets = read_topic_offsets(source, [] if report.topic_pattern else report.topics,
                                         pattern=report.topic_pattern)  # a pattern's new matches are lag too
        finally:
            source.close()
    except (ExactlyOnceError, KafkaError, OSError, ValueError, TypeError) as exc:
        return LagResult(ledger_only, servers, f"Kafka at {servers or '(no servers)'} could not be asked for the "
                                               f"topics' offsets: {_first_line(exc)}")
    return LagResult(partition_lags(report.committed, report.claimed, offsets.last_stable, offsets.log_start),
                     servers)
