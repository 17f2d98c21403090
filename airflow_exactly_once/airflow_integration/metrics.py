"""A pipeline's metrics, through Airflow's own metrics layer: one place owns their names and how they go out.

The operators and the backlog trigger hand plain numbers to `PipelineMetrics`; it sends them with
Airflow's `Stats`, so they reach whatever the deployment configured in `[metrics]` (StatsD,
Datadog's DogStatsD, OpenTelemetry; nothing when metrics are off) with Airflow's own prefix,
allow/block lists and name handler.

Each value goes out twice, as Airflow does for its DAG and task metrics (`ti.start.<dag>.<task>`
beside `ti.start` tagged with dag_id and task_id): once under a legacy name that carries the
pipeline id and the tag values (`exactly_once.lag.<pipeline>.<topic>.<partition>`: plain
StatsD drops tags, so this is the only way it tells pipelines apart), once under the bare name
with tags (`exactly_once.lag` {pipeline_id, topic, partition}) for tag-aware backends. The
values in a legacy name are sanitized as Airflow does for its own: a "." becomes "__" (it would
add a level to the name's hierarchy), anything else its name validator refuses "_". Where
Airflow has `[metrics] legacy_names_on` (releases after 3.1) and it is off, legacy names are not sent.

Metrics never fail a task: an error while emitting (or while working out what to emit, inside
`reporting`) is logged and dropped.
"""

from __future__ import annotations

import logging
import string
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from airflow_exactly_once.airflow_integration.compat import Stats, legacy_metric_names
from airflow_exactly_once.observe.backlog import InFlightSummary
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.task_log import TaskLog

log = logging.getLogger(__name__)

PREFIX = "exactly_once"
# What every Airflow release's default stat name handler accepts (3.1 also takes "/", later ones do not); a
# pipeline id or topic in a legacy name keeps these and turns "." into "__" (one level each), the rest into "_".
NAME_CHARACTERS = frozenset(string.ascii_letters + string.digits + "_-")
# Airflow refuses longer names (250 characters; OpenTelemetry 255 with its prefix): a legacy name longer than
# this is left out, the tagged one still goes.
MAX_LEGACY_NAME = 200
PHASES = ("plan", "write", "notify_complete")
TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class Metric:
    """One metric as the docs' table shows it (docs/operating.md is generated from METRICS)."""

    name: str  # after PREFIX
    kind: str  # counter | gauge | timer
    tags: tuple[str, ...]  # besides pipeline_id, in the order the legacy name carries them
    unit: str
    meaning: str

    @property
    def full_name(self) -> str:
        return f"{PREFIX}.{self.name}"

    @property
    def legacy_pattern(self) -> str:
        return ".".join([self.full_name, "<pipeline_id>", *(f"<{tag}>" for tag in self.tags)])


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("records_read", "counter", (), "records",
           "Records a batch read from Kafka, counted when the batch commits (notify_complete, or plan's recovery)."),
    Metric("records_written", "counter", (), "records",
           "Records a batch wrote to the sink, counted when it commits."),
    Metric("records_bad", "counter", ("policy",), "records",
           "Bad records of a committed batch, by the `bad_record_policy` that took them out (`dead_letter`, "
           "`skip`)."),
    Metric("batches_committed", "counter", (), "batches",
           "Batches committed (by notify_complete or by plan's recovery)."),
    Metric("batch_duration", "timer", ("phase",), "ms",
           "How long a step took for a batch: `phase` is `plan`, `write` or `notify_complete`."),
    Metric("lag", "gauge", ("topic", "partition"), "records",
           "Committed records in Kafka past the pipeline's position, per partition: the last stable offset minus "
           "the planned batch's end (sent by plan), or minus the committed position or the end of the batch in "
           "flight (sent by the backlog trigger at every poll)."),
    Metric("batches_in_flight", "gauge", (), "batches",
           "Batches PLANNED or PREPARED (sent by plan, notify_complete, abort and the backlog trigger)."),
    Metric("oldest_prepared_age", "gauge", (), "s",
           "Age of the oldest PREPARED batch, from when it was planned (0: none is PREPARED)."),
    Metric("oldest_prepared_deadline_left", "gauge", (), "s",
           "The sink's commit deadline (Kafka: `transaction_timeout_ms`) minus that age: at 0 the staged output is "
           "likely gone and the batch will be processed again. The whole deadline when none is PREPARED; not sent "
           "for sinks without a deadline."),
    Metric("oldest_prepared_deadline_used", "gauge", (), "ratio",
           "That age as a share of the deadline (0 to 1, above 1 when overdue); not sent for sinks without one."),
    Metric("recoveries", "counter", ("outcome",), "batches",
           "PREPARED batches plan's recovery found: `committed`, or `lost` (the sink had dropped the output; the "
           "batch is ABORTED and its range processed again)."),
    Metric("aborts", "counter", ("reason",), "batches",
           "Batches that became ABORTED: `failed_run` (the abort task after a failed run), `output_lost` (the sink "
           "had dropped the PREPARED output, found by notify_complete or recovery), `superseded` (a PLANNED batch "
           "of another run taken over by plan)."),
    Metric("data_loss", "counter", ("policy",), "events",
           "Planned offsets no longer in Kafka: `fail` (a plan or write failed on them under "
           "`data_loss_policy='fail'`; counted per failed attempt), `skip` (a partition skipped under "
           "`data_loss_policy='skip'`)."),
)}


def sanitize(value: Any) -> str:
    """`value` as one level of a legacy metric name: "." becomes "__" (as Airflow does for a task id in a task
    group), what Airflow's validator would refuse "_"."""
    return "".join(c if c in NAME_CHARACTERS else "__" if c == "." else "_" for c in str(value)) or "_"


def markdown_table() -> str:
    """The docs' table of every metric (devtools.docs writes it into docs/operating.md)."""
    rows = ["| metric | type | tags | unit | meaning |", "|---|---|---|---|---|"]
    for metric in METRICS.values():
        tags = ", ".join(f"`{t}`" for t in ("pipeline_id", *metric.tags))
        rows.append(f"| `{metric.full_name}`<br>`{metric.legacy_pattern}` | {metric.kind} | {tags} | {metric.unit} "
                    f"| {metric.meaning} |")
    return "\n".join(rows)


class PipelineMetrics:
    """Sends one pipeline's metrics. `stats`: Airflow's `Stats` (default) or anything with its methods."""

    def __init__(self, pipeline_id: str, stats: Any = None, logger: TaskLog | None = None
                 ) -> None:
        self.pipeline_id = str(pipeline_id)
        self._stats = stats
        self.log = logger or log
        self._warned = False
        self._legacy: bool | None = None  # Airflow's [metrics] legacy_names_on, read at the first send

    @property
    def stats(self) -> Any:
        return Stats if self._stats is None else self._stats

    # -- what the steps know ---------------------------------------------------------

    def batch_committed(self, input_records: int | None, output_records: int | None, bad_records: int = 0,
                        bad_policy: str | None = None) -> None:
        self._send("incr", "batches_committed", 1)
        if input_records is not None:
            self._send("incr", "records_read", int(input_records))
        if output_records is not None:
            self._send("incr", "records_written", int(output_records))
        if bad_records:
            self._send("incr", "records_bad", int(bad_records), policy=bad_policy or "unknown")

    def committed(self, batch: Batch) -> None:
        """A batch this step committed, with the counts its write recorded in the ledger."""
        bad = batch.bad_records
        self.batch_committed(batch.input_records, batch.output_records, batch.bad_record_count,
                             bad.policy if bad else None)

    def phase_duration(self, phase: str, seconds: float) -> None:
        """`phase`: one of PHASES."""
        self._send("timing", "batch_duration", max(0.0, seconds) * 1000.0, phase=phase)

    def lag(self, lag: Mapping[TopicPartition, int]) -> None:
        for (topic, partition), records in sorted(lag.items()):
            self._send("gauge", "lag", int(records), topic=topic, partition=partition)

    def in_flight(self, summary: InFlightSummary) -> None:
        self._send("gauge", "batches_in_flight", summary.total)
        self._send("gauge", "oldest_prepared_age", round(summary.oldest_prepared_age_s or 0.0, 3))
        if summary.remaining_s is not None:
            self._send("gauge", "oldest_prepared_deadline_left", round(summary.remaining_s, 3))
        if summary.deadline_used is not None:
            self._send("gauge", "oldest_prepared_deadline_used", round(summary.deadline_used, 4))

    def recovery(self, outcome: str, count: int = 1) -> None:
        self._send("incr", "recoveries", count, outcome=outcome)

    def abort(self, reason: str, count: int = 1) -> None:
        self._send("incr", "aborts", count, reason=reason)

    def data_loss(self, policy: str, count: int = 1) -> None:
        self._send("incr", "data_loss", count, policy=policy)

    @contextmanager
    def reporting(self, what: str) -> Iterator[None]:
        """Work out and send metrics inside: whatever fails there is logged, never raised into the step."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - metrics never fail a task
            self._failed(f"{what}: {type(exc).__name__}: {exc}")

    # -- sending -------------------------------------------------------------------

    def legacy_name(self, metric: Metric, tags: Mapping[str, Any]) -> str | None:
        """The name that carries the pipeline id and the tag values; None when too long to send, or when the
        deployment turned legacy names off."""
        if self._legacy is None:
            self._legacy = legacy_metric_names()
        name = ".".join([metric.full_name, sanitize(self.pipeline_id), *(sanitize(tags[t]) for t in metric.tags)])
        return name if self._legacy and len(name) <= MAX_LEGACY_NAME else None

    def _send(self, method: str, name: str, value: float, **tags: Any) -> None:
        try:
            metric = METRICS[name]
            if set(tags) != set(metric.tags) or (name == "batch_duration" and tags["phase"] not in PHASES):
                raise ValueError(f"{metric.full_name} takes the tags {metric.tags} (phases {PHASES}), not {tags}")
            send = getattr(self.stats, method)
            legacy = self.legacy_name(metric, tags)
            if legacy is not None:
                send(legacy, value)
            send(metric.full_name, value, tags={"pipeline_id": self.pipeline_id,
                                                **{k: str(v) for k, v in tags.items()}})
        except Exception as exc:  # noqa: BLE001 - metrics never fail a task
            self._failed(f"sending {PREFIX}.{name}: {type(exc).__name__}: {exc}")

    def _failed(self, message: str) -> None:
        """The first failure of this object is a warning; the ones after it (the same cause, mostly) debug lines."""
        if self._warned:
            self.log.debug("metrics of pipeline %s: %s", self.pipeline_id, message)
            return
        self._warned = True
        self.log.warning("metrics of pipeline %s were not sent (%s); the step goes on without them. Check Airflow's "
                         "[metrics] settings", self.pipeline_id, message)
