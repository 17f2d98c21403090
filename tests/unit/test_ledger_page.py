"""The ledger page's HTML, the plugin's registration and the backlog trigger's definition.

The page itself is opened in a real browser against a real api-server in
tests/system/test_ui_page.py; here: what it renders from a ledger, and how Airflow finds it.
"""

from __future__ import annotations

import asyncio
import configparser
import importlib
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

import airflow_exactly_once
from airflow_exactly_once.airflow_integration import provider_info
from airflow_exactly_once.observe.backlog import PartitionLag, read_pipeline
from airflow_exactly_once.observe.drift import DriftReport, Finding
from airflow_exactly_once.ui.loading import (
    DriftResult,
    LagResult,
    LedgerReader,
    PipelineSummary,
    commit_deadline_ms,
    redacted_url,
)
from airflow_exactly_once.ui.page import error_page, pipeline_page, svg_chart
from tests.harness import FakeSource, MarkerWriter, Pipe, open_ledger, pipeline_config

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def ids(page: str) -> set[str]:
    return set(re.findall(r"""\bid=["']([^"']+)["']""", page))


@pytest.fixture
def report(tmp_path):
    config = pipeline_config("p-x", ["t"], {"type": "parquet", "path": str(tmp_path / "out")})
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: FakeSource({("t", 0): 10}),
                writer_factory=MarkerWriter.of)
    batch = pipe.plan("manual__<b>1</b>").batch
    pipe.write(batch.id)
    pipe.commit(batch.id)
    pipe.ledger.record_event("p-x", 1, "rewind", "moved back <script>alert(1)</script>")
    return read_pipeline(pipe.ledger, "p-x")


def test_the_page_shows_the_pipeline_and_escapes_what_the_ledger_holds(report):
    lag = LagResult([PartitionLag("t", 0, 10, None, 25, 0)], "127.0.0.1:9092")
    page = pipeline_page(ledger="sqlite:///x.db", now=NOW, pipelines=[PipelineSummary("p-x", 1, {}, None)],
                         report=report, lag=lag, base="/exactly-once/ui")
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "manual__&lt;b&gt;1&lt;/b&gt;" in page
    assert re.search(r'<tr data-seq="1" data-state="COMMITTED" data-in="10" data-out="10"', page)
    assert 'data-tp="t:0" data-committed="10" data-last-stable="25" data-lag="15"' in page
    assert '<tr class="notable" data-kind="rewind">' in page
    assert {"chart-records", "chart-duration", "batches", "events", "lag"} <= ids(page)
    assert "no batch in flight" in page and "read at 2026-01-02 03:04:05 UTC" in page
    assert 'href="/exactly-once/ui?pipeline=p-x"' in page
    assert "keeps the newest 1000 batches and the last 7 days</div>" in page  # the defaults, seen where users look


def test_kafka_that_does_not_answer_leaves_the_rest_of_the_page(report):
    lag = LagResult([PartitionLag("t", 0, 10, None, None, None)], "127.0.0.1:1", "Kafka at 127.0.0.1:1 could "
                    "not be asked for the topics' offsets: NoBrokersAvailable")
    page = pipeline_page(ledger="l", now=NOW, pipelines=[PipelineSummary("p-x", 1, {}, None)], report=report,
                         lag=lag, base="/b")
    assert {"kafka-error", "batches", "events"} <= ids(page) and "NoBrokersAvailable" in page
    assert lag.total is None and 'id="card-lag"><div class="v">?' in page


def test_the_drift_section_shows_each_difference_and_what_could_not_be_compared(report):
    found = DriftReport("p-x", ["consumer group 'g'", "2 Asset event(s) of x-exactly-once://p-x"], [
        Finding("group-behind", "t[0]", "group 'g' is at 5, the ledger's position is 10", "the last mirror failed",
                "run `airflow-exactly-once mirror p-x --execute`"),
        Finding("event-repeated", "batch 1", "Airflow recorded 2 events <b>", "cleared", drift=False)])
    page = pipeline_page(ledger="l", now=NOW, pipelines=[PipelineSummary("p-x", 1, {}, None)], report=report,
                         lag=None, base="/b", drift=DriftResult(found, ["consumer group 'h': NoBrokersAvailable"]))
    assert {"drift", "drift-found", "drift-compared"} <= ids(page) and "drift-ok" not in ids(page)
    assert '<tr data-kind="group-behind" data-drift="true">' in page
    assert '<tr data-kind="event-repeated" data-drift="false">' in page and "2 events &lt;b&gt;" in page
    assert "1 difference(s) from the ledger" in page
    assert "Not compared.</b> consumer group &#x27;h&#x27;: NoBrokersAvailable" in page
    clean = pipeline_page(ledger="l", now=NOW, pipelines=[PipelineSummary("p-x", 1, {}, None)], report=report,
                          lag=None, base="/b", drift=DriftResult(DriftReport("p-x", ["consumer group: none"])))
    assert "drift-ok" in ids(clean) and "drift" not in ids(clean)


def test_the_ledger_error_page_and_an_empty_ledger(tmp_path):
    page = error_page("postgresql://u:***@h/db", "the ledger ... did not answer: connection refused", NOW)
    assert "ledger-error" in ids(page) and "connection refused" in page
    empty = pipeline_page(ledger="l", now=NOW, pipelines=[], report=None, lag=None, base="/b")
    assert "no-pipelines" in ids(empty)
    reader = LedgerReader(f"sqlite:///{tmp_path / 'never-created.db'}")
    assert reader.pipelines() == [] and reader.report("p") is None
    assert not (tmp_path / "never-created.db").exists()


def test_urls_shown_on_the_page_hide_passwords_and_deadlines_come_from_the_sink():
    assert redacted_url("postgresql+psycopg2://u:secret@db:5432/l") == "postgresql+psycopg2://u:***@db:5432/l"
    assert commit_deadline_ms({"sink": {"type": "kafka", "topic": "o", "transaction_timeout_ms": 90_000}}) == 90_000
    assert commit_deadline_ms({"sink": {"type": "kafka", "topic": "o", "guarantee": "AT_LEAST_ONCE"}}) is None
    assert commit_deadline_ms({"sink": {"type": "parquet", "path": "/x"}}) is None
    assert commit_deadline_ms({"sink": {"type": "nope"}}) is None


def test_charts_scale_to_the_largest_value():
    svg = svg_chart([(1, 10.0), (2, 40.0), (3, None)], ident="c", unit="records", colour="#000", bars=True)
    heights = [float(h) for h in re.findall(r'<rect [^>]*height="([\d.]+)"', svg)]
    assert len(heights) == 2 and heights[1] == pytest.approx(4 * heights[0])
    assert "40 records" in svg and "batch 1" in svg and "batch 3" in svg
    assert "no committed batches yet" in svg_chart([], ident="c", unit="s", colour="#000", bars=False)


# -- how Airflow finds the plugin and the trigger ------------------------------------------------


def test_the_plugin_is_declared_where_airflow_looks_for_it():
    from airflow.plugins_manager import AirflowPlugin

    from airflow_exactly_once.ui.plugin import PAGE_ROUTE, ExactlyOncePlugin

    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    entry = cfg["options.entry_points"]["airflow.plugins"].strip()
    assert entry == "exactly_once = airflow_exactly_once.ui.plugin:ExactlyOncePlugin"
    info = airflow_exactly_once.get_provider_info()
    assert info["plugins"] == [{"name": "exactly_once", "plugin-class": entry.split(" = ")[1].replace(":", ".")}]
    assert issubclass(ExactlyOncePlugin, AirflowPlugin) and ExactlyOncePlugin.name == "exactly_once"
    ExactlyOncePlugin.validate()
    [app] = ExactlyOncePlugin.fastapi_apps
    [view] = ExactlyOncePlugin.external_views
    assert view["href"] == app["url_prefix"] + "/ui" and view["url_route"] == PAGE_ROUTE


def test_the_plugins_app_is_built_on_its_first_request_only():
    from airflow_exactly_once.ui.plugin import LazyApp

    built, seen = [], []

    def factory():
        built.append(1)

        async def app(scope, receive, send):
            seen.append(scope["path"])
        return app

    lazy = LazyApp(factory)
    assert built == []
    for path in ("/ui", "/api/pipelines"):
        asyncio.run(lazy({"type": "http", "path": path}, None, None))
    assert built == [1] and seen == ["/ui", "/api/pipelines"]


def test_provider_info_lists_the_trigger_modules_and_the_config_section():
    info = airflow_exactly_once.get_provider_info()
    [entry] = info["triggers"]
    assert entry["python-modules"] == provider_info.TRIGGER_MODULES
    for module in entry["python-modules"]:
        importlib.import_module(module)
    assert set(info["config"]["exactly_once"]["options"]) == {"ledger_conn_id", "ledger_url", "kafka_timeout_ms",
                                                              "embedded_ledger_shared"}


def test_the_backlog_trigger_serializes_to_what_rebuilds_it():
    from airflow_exactly_once.triggers.backlog import PipelineBacklogTrigger

    trigger = PipelineBacklogTrigger(pipeline_id="p", topics="t", bootstrap_servers="h:1", min_records=50,
                                     max_wait_seconds=30, poll_interval_seconds=2)
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (classpath, kwargs) and kwargs["topics"] == ["t"]
    from airflow_exactly_once.airflow_integration.compat import BaseEventTrigger

    assert isinstance(again, BaseEventTrigger)


def test_the_backlog_triggers_default_poll_is_the_one_its_docs_state():
    from airflow_exactly_once.triggers.backlog import PipelineBacklogTrigger

    docs = (Path(__file__).resolve().parents[2] / "docs" / "triggers.md").read_text()
    [row] = [line for line in docs.splitlines() if line.startswith("| `poll_interval_seconds` |")]
    assert row.split("|")[2].strip() == f"{PipelineBacklogTrigger(pipeline_id='p', topics='t').poll_interval_seconds:g}"


@pytest.mark.parametrize("kwargs, message", [
    ({"min_records": 0}, "min_records=0"),
    ({"max_wait_seconds": -1}, "must be positive"),
    ({"topics": []}, "needs the pipeline's topics"),
    ({"poll_interval_seconds": 0}, "poll_interval_seconds must be positive"),
])
def test_the_backlog_trigger_refuses_settings_that_make_no_sense(kwargs, message):
    from airflow_exactly_once.triggers.backlog import PipelineBacklogTrigger

    with pytest.raises(Exception, match=message):
        PipelineBacklogTrigger(**{"pipeline_id": "p", "topics": ["t"], **kwargs})
