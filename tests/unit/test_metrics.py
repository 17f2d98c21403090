"""A pipeline's metrics: names, tags and values, what Airflow's metrics layer makes of them, and that sending
them never fails a step (airflow_integration/metrics.py; the end-to-end check is tests/system/test_metrics_airflow.py)."""

from __future__ import annotations

import inspect

import logging
from datetime import datetime, timedelta, timezone

import importlib

import pytest

from airflow_exactly_once.airflow_integration import metrics as metrics_module
from airflow_exactly_once.airflow_integration.metrics import METRICS, PipelineMetrics, markdown_table, sanitize
from airflow_exactly_once.observe.backlog import InFlightSummary
from airflow_exactly_once.core.errors import TransactionLostError
from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.operators.batch import AbortBatchOperator, NotifyCompleteOperator
from airflow_exactly_once.sinks.parquet.sink_committer import ParquetSinkCommitter
from tests.harness import FakeSource, MarkerWriter, Pipe, open_ledger, pipeline_config


def airflow_metrics(module: str):
    """A module of Airflow's metrics layer: airflow.metrics on 3.1, the shared observability package after it."""
    try:
        return importlib.import_module(f"airflow.metrics.{module}")
    except ImportError:
        return importlib.import_module(f"airflow._shared.observability.metrics.{module}")


validators = airflow_metrics("validators")
PatternAllowListValidator = validators.PatternAllowListValidator
stat_name_default_handler = validators.stat_name_default_handler
stat_name_otel_handler = validators.stat_name_otel_handler


class FakeStats:
    """Records what would go to Airflow's Stats: (method, name, value, tags)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float, dict | None]] = []

    def _record(self, method):
        def send(stat, value=1, *args, tags=None, **kwargs):
            self.sent.append((method, stat, value, tags))
        return send

    def __getattr__(self, method):
        if method in ("incr", "gauge", "timing"):
            return self._record(method)
        raise AttributeError(method)

    def named(self, name: str) -> list[tuple[str, str, float, dict | None]]:
        return [s for s in self.sent if s[1] == name]

    def value(self, name: str, **tags) -> float:
        """The value of the one send of `name` (with exactly `tags`, or none for a legacy name)."""
        found = [s[2] for s in self.sent if s[1] == name and (s[3] or {}) == tags]
        assert len(found) == 1, f"{name} {tags} was sent {len(found)} times: {self.sent}"
        return found[0]


class BrokenStats:
    """A metrics backend that fails on every call (a bad host, a broken custom client)."""

    def __getattr__(self, method):
        def fail(*args, **kwargs):
            raise OSError("statsd host unreachable")
        return fail


@pytest.fixture
def stats(monkeypatch) -> FakeStats:
    """Airflow's Stats, as every PipelineMetrics without its own sees it, replaced by a recorder."""
    fake = FakeStats()
    monkeypatch.setattr(metrics_module, "Stats", fake)
    return fake


def test_each_value_goes_under_a_legacy_name_and_under_the_tagged_name():
    fake = FakeStats()
    metrics = PipelineMetrics("orders", stats=fake)
    metrics.batch_committed(input_records=10, output_records=8, bad_records=2, bad_policy="dead_letter")
    metrics.lag({("events", 1): 7, ("events", 0): 3})
    metrics.phase_duration("write", 1.5)
    assert fake.sent == [
        ("incr", "exactly_once.batches_committed.orders", 1, None),
        ("incr", "exactly_once.batches_committed", 1, {"pipeline_id": "orders"}),
        ("incr", "exactly_once.records_read.orders", 10, None),
        ("incr", "exactly_once.records_read", 10, {"pipeline_id": "orders"}),
        ("incr", "exactly_once.records_written.orders", 8, None),
        ("incr", "exactly_once.records_written", 8, {"pipeline_id": "orders"}),
        ("incr", "exactly_once.records_bad.orders.dead_letter", 2, None),
        ("incr", "exactly_once.records_bad", 2, {"pipeline_id": "orders", "policy": "dead_letter"}),
        ("gauge", "exactly_once.lag.orders.events.0", 3, None),
        ("gauge", "exactly_once.lag", 3, {"pipeline_id": "orders", "topic": "events", "partition": "0"}),
        ("gauge", "exactly_once.lag.orders.events.1", 7, None),
        ("gauge", "exactly_once.lag", 7, {"pipeline_id": "orders", "topic": "events", "partition": "1"}),
        ("timing", "exactly_once.batch_duration.orders.write", 1500.0, None),
        ("timing", "exactly_once.batch_duration", 1500.0, {"pipeline_id": "orders", "phase": "write"}),
    ]


def test_no_bad_records_send_no_bad_record_count():
    fake = FakeStats()
    PipelineMetrics("p", stats=fake).batch_committed(5, 5)
    assert not fake.named("exactly_once.records_bad") and fake.value("exactly_once.records_read", pipeline_id="p") == 5


def test_in_flight_gauges_against_the_deadline_and_without_one():
    fake = FakeStats()
    PipelineMetrics("p", stats=fake).in_flight(InFlightSummary(planned=1, prepared=2, oldest_prepared_age_s=45.0,
                                                               deadline_s=60.0))
    assert fake.value("exactly_once.batches_in_flight", pipeline_id="p") == 3
    assert fake.value("exactly_once.oldest_prepared_age", pipeline_id="p") == 45.0
    assert fake.value("exactly_once.oldest_prepared_deadline_left", pipeline_id="p") == 15.0
    assert fake.value("exactly_once.oldest_prepared_deadline_used.p") == 0.75
    none_prepared = FakeStats()
    PipelineMetrics("p", stats=none_prepared).in_flight(InFlightSummary(1, 0, None, 60.0))
    assert none_prepared.value("exactly_once.oldest_prepared_age.p") == 0
    assert none_prepared.value("exactly_once.oldest_prepared_deadline_left.p") == 60.0  # the whole budget
    assert none_prepared.value("exactly_once.oldest_prepared_deadline_used.p") == 0
    no_deadline = FakeStats()
    PipelineMetrics("p", stats=no_deadline).in_flight(InFlightSummary(0, 1, 30.0, None))  # e.g. Parquet
    assert no_deadline.value("exactly_once.oldest_prepared_age.p") == 30.0
    assert not no_deadline.named("exactly_once.oldest_prepared_deadline_left")
    assert not no_deadline.named("exactly_once.oldest_prepared_deadline_used")


def test_in_flight_summary_ages_batches_from_when_they_were_planned(tmp_path):
    pipe = Pipe(pipeline_config("p", ["t"], {"type": "parquet", "path": str(tmp_path / "out")},
                                max_records_per_partition=2),
                open_ledger(tmp_path / "ledger.db"), lambda: FakeSource({("t", 0): 10}), writer_factory=MarkerWriter.of)
    batch = pipe.plan("r1").batch
    planned_at = pipe.ledger.get_batch(batch.id).created_at.replace(tzinfo=timezone.utc)
    flying = pipe.ledger.list_batches("p", [BatchState.PLANNED, BatchState.PREPARED])
    planned = InFlightSummary.read(flying, planned_at + timedelta(seconds=5), commit_deadline_ms=120_000)
    assert (planned.planned, planned.prepared, planned.oldest_prepared_age_s) == (1, 0, None)
    assert planned.remaining_s == 120.0 and planned.deadline_used == 0.0
    pipe.write(batch.id)
    flying = pipe.ledger.list_batches("p", [BatchState.PLANNED, BatchState.PREPARED, BatchState.COMMITTED])
    summary = InFlightSummary.read(flying, planned_at + timedelta(seconds=90), commit_deadline_ms=120_000)
    assert (summary.planned, summary.prepared, summary.oldest_prepared_age_s) == (0, 1, 90.0)
    assert summary.remaining_s == 30.0 and summary.deadline_used == 0.75
    overdue = InFlightSummary.read(flying, planned_at + timedelta(seconds=150), commit_deadline_ms=120_000)
    assert overdue.remaining_s == -30.0 and overdue.deadline_used == 1.25
    assert InFlightSummary.read(flying, planned_at, commit_deadline_ms=None).remaining_s is None


def test_every_name_passes_airflows_validators_and_the_otel_length_rule():
    fake = FakeStats()
    metrics = PipelineMetrics("a-pipeline_1.v2", stats=fake)
    metrics.batch_committed(1, 1, 1, "skip")
    metrics.lag({("orders.eu-west_1", 11): 1})
    for phase in ("plan", "write", "notify_complete"):
        metrics.phase_duration(phase, 0.1)
    metrics.in_flight(InFlightSummary(1, 1, 1.0, 10.0))
    metrics.recovery("committed"), metrics.recovery("lost"), metrics.data_loss("skip")
    for reason in ("failed_run", "output_lost", "superseded"):
        metrics.abort(reason)
    assert {s[1].split(".")[1] for s in fake.sent} == set(METRICS)  # every declared metric was sent
    for _, name, _, _ in fake.sent:
        assert stat_name_default_handler(name) == name
        assert stat_name_otel_handler("airflow", name) == f"airflow.{name}"


def test_a_pipeline_id_or_topic_airflow_would_refuse_is_sanitized_in_the_name_not_in_the_tag():
    assert sanitize("orders:eu west/ü,x=1") == "orders_eu_west___x_1"
    assert sanitize("orders.eu") == "orders__eu"  # one level of the name, as Airflow does for task group ids
    fake = FakeStats()
    PipelineMetrics("orders:eu west", stats=fake).lag({("tö.pic", 0): 4})
    (_, legacy, _, _), (_, tagged, _, tags) = fake.sent
    assert legacy == "exactly_once.lag.orders_eu_west.t___pic.0" and stat_name_default_handler(legacy) == legacy
    assert tagged == "exactly_once.lag" and tags == {"pipeline_id": "orders:eu west", "topic": "tö.pic",
                                                      "partition": "0"}


def test_no_legacy_names_where_the_deployment_turned_them_off(monkeypatch):
    monkeypatch.setattr(metrics_module, "legacy_metric_names", lambda: False)  # [metrics] legacy_names_on = False
    fake = FakeStats()
    PipelineMetrics("orders", stats=fake).lag({("events", 0): 1})
    assert fake.sent == [("gauge", "exactly_once.lag", 1, {"pipeline_id": "orders", "topic": "events",
                                                          "partition": "0"})]


def test_a_legacy_name_too_long_for_airflow_is_left_out_and_the_tagged_one_still_goes():
    fake = FakeStats()
    long_id = "p" * 250
    PipelineMetrics(long_id, stats=fake).batch_committed(3, 3)
    assert [s[1] for s in fake.sent] == ["exactly_once.batches_committed", "exactly_once.records_read",
                                         "exactly_once.records_written"]
    assert fake.value("exactly_once.records_read", pipeline_id=long_id) == 3


def test_sending_through_airflows_statsd_logger_with_an_allow_list_and_influxdb_tags():
    """The real SafeStatsdLogger and statsd client (its datagrams caught, not sent): prefix, allow list, tags."""
    from statsd import StatsClient

    SafeStatsdLogger = airflow_metrics("statsd_logger").SafeStatsdLogger

    class CaughtClient(StatsClient):
        def __init__(self):
            super().__init__(host="127.0.0.1", port=9, prefix="airflow")
            self.datagrams: list[str] = []

        def _send(self, data):
            self.datagrams.append(data)

    plain = CaughtClient()
    PipelineMetrics("orders", stats=SafeStatsdLogger(plain, PatternAllowListValidator("exactly_once"))).lag(
        {("events", 2): 9})
    assert plain.datagrams == ["airflow.exactly_once.lag.orders.events.2:9|g", "airflow.exactly_once.lag:9|g"]
    refused = CaughtClient()
    PipelineMetrics("orders", stats=SafeStatsdLogger(refused, PatternAllowListValidator("scheduler"))).lag(
        {("events", 2): 9})
    assert refused.datagrams == []  # metrics_allow_list without exactly_once: none of ours
    influx = CaughtClient()
    # what Airflow's get_statsd_logger gives for statsd_influxdb_enabled: Airflow after 3.1 also needs it to let its
    # name validator accept the tags in the name (3.1 has no such argument)
    influx_name_check = ({"statsd_influxdb_enabled": True}
                         if "statsd_influxdb_enabled" in inspect.signature(SafeStatsdLogger).parameters else {})
    PipelineMetrics("orders", stats=SafeStatsdLogger(influx, influxdb_tags_enabled=True, **influx_name_check)
                    ).phase_duration("plan", 0.25)
    assert influx.datagrams == ["airflow.exactly_once.batch_duration.orders.plan:250.000000|ms",
                                "airflow.exactly_once.batch_duration,pipeline_id=orders,phase=plan:250.000000|ms"]


def test_sending_through_airflows_opentelemetry_logger_keeps_the_tags_as_attributes():
    from opentelemetry.sdk.metrics import MeterProvider

    SafeOtelLogger = airflow_metrics("otel_logger").SafeOtelLogger
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics = PipelineMetrics("orders", stats=SafeOtelLogger(MeterProvider(metric_readers=[reader])))
    metrics.batch_committed(10, 9, 1, "skip")
    metrics.lag({("events", 0): 4})
    metrics.phase_duration("notify_complete", 0.5)
    points = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:  # a timing is a gauge on Airflow 3.1, a histogram after it
                    value = point.value if hasattr(point, "value") else point.sum
                    points[(metric.name, tuple(sorted(point.attributes.items())))] = value
    assert points[("airflow.exactly_once.records_read", (("pipeline_id", "orders"),))] == 10
    assert points[("airflow.exactly_once.records_read.orders", ())] == 10
    assert points[("airflow.exactly_once.records_bad", (("pipeline_id", "orders"), ("policy", "skip")))] == 1
    assert points[("airflow.exactly_once.lag", (("partition", "0"), ("pipeline_id", "orders"),
                                                ("topic", "events")))] == 4
    assert points[("airflow.exactly_once.batch_duration", (("phase", "notify_complete"),
                                                           ("pipeline_id", "orders")))] == 500.0


def test_an_emitting_error_is_logged_once_and_never_raised(caplog):
    metrics = PipelineMetrics("p", stats=BrokenStats())
    with caplog.at_level(logging.DEBUG, logger="airflow_exactly_once.airflow_integration.metrics"):
        metrics.batch_committed(1, 1, 1, "skip")
        metrics.lag({("t", 0): 1})
        metrics.phase_duration("plan", 1.0)
        metrics.in_flight(InFlightSummary(0, 0, None, None))
        metrics.recovery("lost"), metrics.abort("failed_run"), metrics.data_loss("fail")
        with metrics.reporting("plan"):
            raise RuntimeError("the ledger went away while working out the lag")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "statsd host unreachable" in warnings[0].getMessage()
    assert "Check Airflow's [metrics] settings" in warnings[0].getMessage()
    assert any("the ledger went away" in r.getMessage() for r in caplog.records)


def test_a_misused_metric_is_logged_not_raised(caplog):
    fake = FakeStats()
    with caplog.at_level(logging.WARNING, logger="airflow_exactly_once.airflow_integration.metrics"):
        PipelineMetrics("p", stats=fake).phase_duration("transform", 1.0)
    assert fake.sent == [] and "phases" in caplog.text


# -- where the steps get their numbers ---------------------------------------------------------


@pytest.fixture
def pipe(tmp_path) -> Pipe:
    config = pipeline_config("p", ["t"], {"type": "parquet", "path": str(tmp_path / "out")},
                             max_records_per_partition=5)
    return Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: FakeSource({("t", 0): 12, ("t", 1): 7}),
                writer_factory=MarkerWriter.of)


def test_plan_knows_the_lag_behind_its_batch_and_what_it_superseded(pipe):
    first = pipe.plan("r1")
    assert first.last_stable == {("t", 0): 12, ("t", 1): 7}
    assert first.lag == {("t", 0): 7, ("t", 1): 2} and first.superseded == ()
    second = pipe.plan("r2")  # r1's batch is still PLANNED (its run died): taken over
    assert second.superseded == (first.batch.seq,) and second.lag == {("t", 0): 7, ("t", 1): 2}
    replay = pipe.plan("r2")  # a retried plan reuses its batch and reads no offsets
    assert replay.action == "replay" and replay.lag == {} and replay.superseded == ()


def test_recovery_lists_the_batches_it_found_lost(pipe, tmp_path):
    batch = pipe.plan("r1").batch
    pipe.write(batch.id)

    class LostCommitter(ParquetSinkCommitter):
        def commit(self, batch, committable):
            raise TransactionLostError("the transaction timed out")

    coordinator = Pipe(pipe.config, pipe.ledger, pipe.source_factory, writer_factory=MarkerWriter.of,
                       committer_factory=lambda c: LostCommitter(c.sink)).coordinator
    coordinator.recover()
    assert coordinator.recovery_lost == [batch.id] and coordinator.recovered == []


def operator_args(pipe: Pipe) -> dict:
    return dict(pipeline_id="p", topics="t", bootstrap_servers="127.0.0.1:9", sink=dict(pipe.config.sink),
                max_records_per_partition=5, ledger_url=str(pipe.ledger.engine.url))


def test_notify_complete_counts_the_batch_it_committed_and_its_duration(pipe, stats):
    batch = pipe.plan("r1").batch
    claimed = pipe.claim(batch.id)  # the write: 10 records read, 8 written, 2 sent to the dead letters
    pipe.coordinator.prepare(claimed, pipe.stage(None, claimed), 10, 8,
                             details={"bad_records": {"count": 2, "policy": "dead_letter", "first": []}})
    notify = NotifyCompleteOperator(task_id="notify", batch_id=str(batch.id), **operator_args(pipe))
    notify.execute(context={})
    assert pipe.state(batch.id) is BatchState.COMMITTED
    assert stats.value("exactly_once.records_read", pipeline_id="p") == 10
    assert stats.value("exactly_once.records_written.p") == 8
    assert stats.value("exactly_once.records_bad", pipeline_id="p", policy="dead_letter") == 2
    assert stats.value("exactly_once.batch_duration", pipeline_id="p", phase="notify_complete") > 0
    assert stats.value("exactly_once.batches_in_flight", pipeline_id="p") == 0
    stats.sent.clear()
    notify.execute(context={})  # a retry finds it committed: counted once
    assert not stats.named("exactly_once.records_read")


def test_abort_counts_a_batch_it_aborted_once(pipe, stats):
    batch = pipe.plan("r1").batch
    abort = AbortBatchOperator(task_id="abort", batch_id=str(batch.id), **operator_args(pipe))
    abort.execute(context={"run_id": "r1"})
    abort.execute(context={"run_id": "r1"})  # a retry: already ABORTED
    assert pipe.state(batch.id) is BatchState.ABORTED
    assert stats.value("exactly_once.aborts", pipeline_id="p", reason="failed_run") == 1


def test_an_emitting_error_never_fails_a_step(pipe, monkeypatch):
    monkeypatch.setattr(metrics_module, "Stats", BrokenStats())
    batch = pipe.plan("r1").batch
    pipe.write(batch.id)
    message = NotifyCompleteOperator(task_id="notify", batch_id=str(batch.id), **operator_args(pipe)).execute({})
    assert "COMMITTED" in message and pipe.state(batch.id) is BatchState.COMMITTED
    second = pipe.plan("r2").batch
    AbortBatchOperator(task_id="abort", batch_id=str(second.id), **operator_args(pipe)).execute({"run_id": "r2"})
    assert pipe.state(second.id) is BatchState.ABORTED


def test_the_backlog_trigger_sends_lag_under_the_plan_steps_names_and_the_batches_in_flight(pipe, stats):
    from airflow_exactly_once.triggers.backlog import Backlog, PipelineBacklogTrigger, _Probe

    plan = pipe.plan("r1")
    PipelineMetrics("p").lag(plan.lag)
    from_plan = list(stats.sent)
    stats.sent.clear()
    trigger = PipelineBacklogTrigger(pipeline_id="p", topics="t", bootstrap_servers="127.0.0.1:9",
                                     ledger_url=str(pipe.ledger.engine.url))
    probe = _Probe(trigger)
    positions, last_seq, in_flight = probe._positions()
    assert positions == {("t", 0): 5, ("t", 1): 5} and in_flight == InFlightSummary(1, 0, None, None)
    probe.report(Backlog({("t", 0): 12 - 5, ("t", 1): 7 - 5}, [], last_seq, {("t", 0): 12, ("t", 1): 7}, positions,
                         in_flight))
    assert [s for s in stats.sent if "lag" in s[1]] == from_plan
    assert stats.value("exactly_once.batches_in_flight", pipeline_id="p") == 1
    probe.close()


def test_the_docs_table_lists_every_metric_with_its_type_and_tags():
    table = markdown_table()
    for metric in METRICS.values():
        assert f"| `{metric.full_name}`<br>`{metric.legacy_pattern}` | {metric.kind} |" in table
    assert "`pipeline_id`, `topic`, `partition`" in table


def test_the_watcher_and_the_steps_see_the_same_commit_deadline(tmp_path):
    """The trigger works it out from the configuration the ledger stores: with dead letters, the shorter one."""
    from airflow_exactly_once.sinks import pipeline_committer, stored_commit_deadline_ms

    config = pipeline_config("p", ["t"], {"type": "kafka", "topic": "out", "transaction_timeout_ms": 120_000},
                             dead_letter={"type": "kafka", "topic": "dlq", "transaction_timeout_ms": 90_000},
                             bad_record_policy="dead_letter", value_format="json", value_schema="id BIGINT")
    steps = pipeline_committer(config).bind(config).commit_deadline_ms()
    assert steps == 90_000 and stored_commit_deadline_ms(config.to_stored_dict()) == steps
    assert stored_commit_deadline_ms({"sink": {"type": "kafka", "topic": "o", "transaction_timeout_ms": 5000}}) == 5000
