"""The ledger page in a real browser, served by a real Airflow api-server, checked against the ledger.

The ledger is filled through the protocol (tests/harness.py: plan, write, commit, recovery,
abort; the real broker's offsets; a sink that needs no Spark), in the embedded ledger of the
session's Airflow; the page is read by headless Chromium (devtools/browser.py), directly and
inside Airflow's own UI (Browse -> Exactly-once ledger), and saved as a screenshot.

Pipelines and who may see them, by the FAB auth manager's DAG permissions (tests/system/conftest.py:
alice may read kafka_to_parquet, bob kafka_to_kafka and eo_ui_noop, admin every DAG):
  orders   recorded DAG kafka_to_parquet                    admin, alice
  payments recorded DAG kafka_to_kafka (Kafka sink)         admin, bob
  refunds  no recorded DAG; its run ids are eo_ui_noop's    admin, bob
  orphan   no DAG at all (and a broker that never answers)  admin
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition

from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from devtools.browser import Browser
from tests.harness import FakeSource, MarkerWriter, Pipe, open_ledger, pipeline_config
from tests.helpers import create_topic, produce
from tests.system.conftest import UI_LEDGER_CONN

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT = "ledger-page.png"
# The screenshot in the docs is refreshed only when asked (a test run must not dirty the repository).
UPDATE_DOC_IMAGES = os.environ.get("AEO_UPDATE_DOC_IMAGES") == "1"


def call(base_url: str, path: str, token: str | None) -> tuple[int, Any]:
    request = urllib.request.Request(base_url + path)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read().decode())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def pipelines(kafka, airflow, ledger_ui, unreachable, tmp_path_factory, unique_module) -> dict[str, str]:
    """The four pipelines of the module docstring, in the session's embedded ledger; `orders` changes last."""
    folder = tmp_path_factory.mktemp("ui-pipelines")
    ledger = open_ledger(Path(ledger_ui.ledger_url.removeprefix("sqlite:///")))
    names = {k: f"ui-{k}-{unique_module}" for k in ("orders", "payments", "refunds", "orphan")}

    # payments: the Kafka sink (transactions time out after 60 s), one batch planned and in flight
    create_topic(kafka.bootstrap_servers, names["payments"])
    create_topic(kafka.bootstrap_servers, f"{names['payments']}-out")
    produce(kafka.bootstrap_servers, names["payments"], 50)
    config = pipeline_config(names["payments"], [names["payments"]], {
        "type": "kafka", "topic": f"{names['payments']}-out", "transaction_timeout_ms": 60_000},
        bootstrap=kafka.bootstrap_servers)
    Pipe(config, ledger, lambda: KafkaOffsetSource(KafkaSettings.of(config))).plan("manual__payments_1")
    ledger.record_dag(names["payments"], "kafka_to_kafka")

    # refunds: batches of a real run of eo_ui_noop, no recorded DAG
    airflow.wait_for_dag("eo_ui_noop")
    run_id = airflow.trigger("eo_ui_noop", f"refunds-{unique_module}")
    refunds = Pipe(pipeline_config(names["refunds"], ["refunds"], {"type": "parquet", "path": str(folder / "r")}),
                   ledger, lambda: FakeSource({("refunds", 0): 12}), writer_factory=MarkerWriter.of)
    batch = refunds.plan(run_id).batch
    refunds.write(batch.id)
    refunds.commit(batch.id)

    # orphan: no DAG; its stored Kafka settings point at a broker that never answers
    orphan = Pipe(pipeline_config(names["orphan"], ["orphan"], {"type": "parquet", "path": str(folder / "o")},
                                  bootstrap=unreachable["kafka"]),
                  ledger, lambda: FakeSource({("orphan", 0): 5}), writer_factory=MarkerWriter.of)
    batch = orphan.plan("manual__orphan_1").batch
    orphan.write(batch.id)
    orphan.commit(batch.id)

    # orders: 300 records on 3 partitions, batches of at most 20 per partition: committed batches, one left
    # PREPARED and committed by the next plan's recovery, one aborted, and one in flight.
    topic = names["orders"]
    create_topic(kafka.bootstrap_servers, topic, partitions=3)
    produce(kafka.bootstrap_servers, topic, 300, json_values=True)
    config = pipeline_config(topic, [topic], {"type": "parquet", "path": str(folder / "orders")},
                             bootstrap=kafka.bootstrap_servers, max_records_per_partition=20)
    orders = Pipe(config, ledger, lambda: KafkaOffsetSource(KafkaSettings.of(config)), writer_factory=MarkerWriter.of)
    ledger.record_dag(topic, "kafka_to_parquet")
    for n in range(1, 4):
        batch = orders.plan(f"scheduled__orders_{n}").batch
        orders.write(batch.id)
        time.sleep(0.4 * n)  # batches of different durations for the chart
        if n != 2:
            orders.commit(batch.id)  # batch 2 stays PREPARED: batch 3's plan recovers it first
    batch = orders.plan("scheduled__orders_4").batch
    orders.abort(batch.id, "the write failed for good (the test aborted it)")
    batch = orders.plan("scheduled__orders_5").batch
    orders.write(batch.id)
    orders.commit(batch.id)
    in_flight = orders.plan("scheduled__orders_6").batch
    assert in_flight.state is BatchState.PLANNED
    return names


@pytest.fixture(scope="module")
def unique_module() -> str:
    import uuid

    return uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def browser():
    with Browser() as started:
        yield started


def last_stable_offsets(bootstrap: str, topic: str) -> dict[str, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        return {f"{tp.topic}:{tp.partition}": offset for tp, offset in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


READ_PAGE = """(() => {
  const rows = (sel) => Array.from(document.querySelectorAll(sel)).map(r => Object.assign({}, r.dataset));
  const text = (sel) => { const e = document.querySelector(sel); return e ? e.innerText : null; };
  return {
    pipeline: document.querySelector('#pipeline') ? document.querySelector('#pipeline').dataset.pipeline : null,
    nav: rows('#pipelines a'), batches: rows('#batches tr[data-seq]'), lag: rows('#lag tr[data-tp]'),
    inFlight: rows('#in-flight tr[data-seq]'), events: rows('#events tr[data-kind]'),
    bars: rows('#chart-records rect'), points: rows('#chart-duration circle'),
    epoch: text('#card-epoch .v'), dags: text('#card-dags .v'), kafkaError: text('#kafka-error'),
    ledgerError: text('#ledger-error'), notice: text('#notice'), body: document.body.innerText,
  };
})()"""


def open_page(browser: Browser, base_url: str, token: str, path: str) -> tuple[int | None, dict[str, Any]]:
    page = browser.new_page()
    try:
        page.set_cookie(base_url, "_token", token)
        status = page.open(base_url + path)
        return status, page.evaluate(READ_PAGE)
    finally:
        page.close()


def test_the_page_shows_what_the_ledger_holds(kafka, ledger_ui, pipelines, browser):
    name = pipelines["orders"]
    status, seen = open_page(browser, ledger_ui.base_url, ledger_ui.token("alice"), f"/exactly-once/ui?pipeline={name}")
    assert status == 200 and seen["pipeline"] == name, seen["body"][:2000]
    ledger = Ledger(ledger_ui.ledger_url)

    batches = ledger.list_batches(name)
    assert [(int(r["seq"]), r["state"], r["in"], r["out"], int(r["epoch"])) for r in seen["batches"]] == [
        (b.seq, b.state.value, "" if b.input_records is None else str(b.input_records),
         "" if b.output_records is None else str(b.output_records), b.epoch) for b in batches]
    assert [b.state for b in reversed(batches)] == [BatchState.COMMITTED] * 3 + [
        BatchState.ABORTED, BatchState.COMMITTED, BatchState.PLANNED]
    assert seen["epoch"] == str(ledger.pipeline(name)["epoch"]) and seen["dags"] == "kafka_to_parquet"

    # lag: the ledger's committed position against the broker's last stable offset, per partition
    committed = {f"{t}:{p}": o for (t, p), o in ledger.committed_positions(name).items()}
    stable = last_stable_offsets(kafka.bootstrap_servers, name)
    assert {r["tp"]: (int(r["committed"]), int(r["lastStable"]), int(r["lag"])) for r in seen["lag"]} == {
        tp: (committed[tp], stable[tp], stable[tp] - committed[tp]) for tp in stable}
    assert sum(stable.values()) == 300 and seen["kafkaError"] is None

    [flying] = seen["inFlight"]
    in_flight = ledger.list_batches(name, [BatchState.PLANNED])[0]
    assert int(flying["seq"]) == in_flight.seq and float(flying["age"]) >= 0 and flying["deadline"] == ""

    kinds = [r["kind"] for r in seen["events"]]
    assert "recovered" in kinds and "aborted" in kinds and kinds.count("partition-added") == 3
    committed_batches = [b for b in reversed(batches) if b.state is BatchState.COMMITTED]
    assert [(int(r["seq"]), int(float(r["value"]))) for r in seen["bars"]] == [
        (b.seq, b.output_records) for b in committed_batches]
    assert [int(r["seq"]) for r in seen["points"]] == [b.seq for b in committed_batches]

    # alice sees the pipelines of kafka_to_parquet only
    shown = {r["pipeline"] for r in seen["nav"]}
    assert name in shown and not shown & {pipelines[k] for k in ("payments", "refunds", "orphan")}


def test_the_page_inside_airflows_ui_and_its_screenshot(ledger_ui, pipelines, browser):
    page = browser.new_page()
    try:
        page.set_cookie(ledger_ui.base_url, "_token", ledger_ui.token("alice"))
        assert page.open(ledger_ui.base_url + "/plugin/exactly-once-ledger") == 200
        frame = page.frame_context("/exactly-once/ui")
        page.wait_for("document.querySelectorAll('#batches tr[data-seq]').length === 6", context_id=frame)
        assert page.evaluate("document.querySelector('#pipeline').dataset.pipeline", frame) == pipelines["orders"]
        # Airflow's navigation around it, with the page's entry in the Browse menu
        assert page.wait_for("document.body.innerText.includes('Browse')")
        time.sleep(1)  # let the UI's fonts and icons settle for the picture
        shot = page.screenshot(REPO / "artifacts" / SCREENSHOT, full_page=False)
    finally:
        page.close()
    assert shot.stat().st_size > 20_000
    if UPDATE_DOC_IMAGES:
        shutil.copyfile(shot, REPO / "docs" / "images" / SCREENSHOT)


def test_who_sees_which_pipeline(ledger_ui, pipelines, browser):
    ours = set(pipelines.values())
    expected = {"admin": ours, "alice": {pipelines["orders"]},
                "bob": {pipelines["payments"], pipelines["refunds"]}}
    for user, visible in expected.items():
        token = ledger_ui.token(user)
        status, listing = call(ledger_ui.base_url, "/exactly-once/api/pipelines", token)
        assert status == 200, listing
        assert {p["pipeline_id"] for p in listing["pipelines"]} & ours == visible, user
        for name in ours:
            status, _ = call(ledger_ui.base_url, f"/exactly-once/api/pipelines/{name}", token)
            assert status == (200 if name in visible else 404), (user, name)
    refunds = next(p for p in call(ledger_ui.base_url, "/exactly-once/api/pipelines", ledger_ui.token("bob"))[1][
        "pipelines"] if p["pipeline_id"] == pipelines["refunds"])
    assert refunds["dag_ids"] == ["eo_ui_noop"]  # attributed through its batches' run ids
    assert call(ledger_ui.base_url, "/exactly-once/api/pipelines", None)[0] == 401

    # bob's Kafka-sink pipeline: its batch in flight against the sink's transaction timeout
    status, payments = call(ledger_ui.base_url, f"/exactly-once/api/pipelines/{pipelines['payments']}",
                            ledger_ui.token("bob"))
    [flying] = payments["in_flight"]
    assert payments["commit_deadline_ms"] == 60_000 and flying["deadline_s"] == 60 and flying["state"] == "PLANNED"
    # its drift check (from the api-server: Airflow's database holds no event of it, and none is due: nothing
    # committed yet) ...
    assert payments["drift"]["ok"] is True and payments["drift"]["errors"] == [], payments["drift"]
    assert payments["drift"]["compared"] == ["consumer group: none (mirror_consumer_group is not set)",
                                             f"0 Asset event(s) of x-exactly-once://{pipelines['payments']}"]
    # ... and refunds': committed outside Airflow's task group, so Airflow recorded no event of its batch
    status, refunds = call(ledger_ui.base_url, f"/exactly-once/api/pipelines/{pipelines['refunds']}",
                           ledger_ui.token("bob"))
    assert [(f["kind"], f["subject"], f["drift"]) for f in refunds["drift"]["findings"]] == [
        ("event-missing", "batches 1", True)] and refunds["drift"]["ok"] is False

    # In the browser, asking for a pipeline one may not see shows none of it.
    status, seen = open_page(browser, ledger_ui.base_url, ledger_ui.token("bob"),
                             f"/exactly-once/ui?pipeline={pipelines['orders']}")
    assert status == 200 and seen["pipeline"] != pipelines["orders"]
    assert pipelines["orders"] not in {r["pipeline"] for r in seen["nav"]}
    assert "No pipeline" in seen["notice"] and "scheduled__orders" not in seen["body"]


def test_a_broker_or_ledger_that_does_not_answer_is_shown_and_the_api_server_carries_on(
        airflow, ledger_ui, pipelines, unreachable, browser):
    admin = ledger_ui.token("admin")
    status, seen = open_page(browser, ledger_ui.base_url, admin, f"/exactly-once/ui?pipeline={pipelines['orphan']}")
    assert status == 200 and seen["pipeline"] == pipelines["orphan"]
    assert unreachable["kafka"] in seen["kafkaError"] and len(seen["batches"]) == 1  # the rest of the page is there

    airflow.put_connection(UI_LEDGER_CONN, {"conn_type": "exactly_once_ledger", "host": unreachable["ledger"]})
    try:
        started = time.monotonic()
        status, seen = open_page(browser, ledger_ui.base_url, admin, "/exactly-once/ui")
        assert status == 503 and "Connection refused" in seen["ledgerError"], seen["body"][:2000]
        assert time.monotonic() - started < 60
        assert call(ledger_ui.base_url, "/exactly-once/api/pipelines", admin)[0] == 503
    finally:
        airflow.put_connection(UI_LEDGER_CONN, {"conn_type": "exactly_once_ledger", "host": ledger_ui.ledger_url})
    with urllib.request.urlopen(ledger_ui.base_url + "/api/v2/monitor/health", timeout=30) as response:
        assert response.status == 200  # the api-server carried on
    status, seen = open_page(browser, ledger_ui.base_url, admin, f"/exactly-once/ui?pipeline={pipelines['orders']}")
    assert status == 200 and seen["ledgerError"] is None and len(seen["batches"]) == 6
