"""topic_pattern as pure logic: the setting, the match, where found topics start, and what a pattern change means."""

from __future__ import annotations

import pytest

from airflow_exactly_once.core.errors import ConfigurationError, DataLossError
from airflow_exactly_once.core.ranges import continuation_ranges
from airflow_exactly_once.core.startup import DISCOVERED_TOPIC, startup_positions
from airflow_exactly_once.core.topics import matched_partitions, matching_topics, partitions_to_read
from tests.harness import FakeSource, pipeline_config

SINK = {"type": "parquet", "path": "/tmp/out"}


def patterned(**overrides):
    return pipeline_config("p", [], SINK, topic_pattern=r"orders\..*", **overrides)


def test_topics_or_a_pattern_exactly_one():
    with pytest.raises(ConfigurationError, match="either topics or topic_pattern, not both"):
        pipeline_config("p", ["orders.eu"], SINK, topic_pattern=r"orders\..*")
    with pytest.raises(ConfigurationError, match="give the Kafka topics to read"):
        pipeline_config("p", [], SINK)
    with pytest.raises(ConfigurationError, match="not a valid regular expression"):
        pipeline_config("p", [], SINK, topic_pattern="orders.(")
    with pytest.raises(ConfigurationError, match="range_mode='interval'"):
        pipeline_config("p", [], SINK, topic_pattern="orders.*", range_mode="interval")
    assert patterned().topics == [] and patterned().topic_pattern == r"orders\..*"


def test_the_pattern_is_part_of_the_fingerprint_and_old_pipelines_keep_theirs():
    listed = pipeline_config("p", ["orders.eu"], SINK)
    assert listed.to_stored_dict()["topic_pattern"] is None
    assert patterned().fingerprint() != pipeline_config("p", [], SINK, topic_pattern="orders.*").fingerprint()
    assert listed.fingerprint() == pipeline_config("p", "orders.eu", SINK).fingerprint()


def test_the_whole_name_must_match_and_internal_topics_never_do():
    names = ["orders.eu", "orders.us", "old.orders.eu", "orders", "__consumer_offsets", "__orders.x", "ordersXeu"]
    assert matching_topics(r"orders\..*", names) == ["orders.eu", "orders.us"]
    assert matching_topics(".*", names) == sorted(n for n in names if not n.startswith("__"))
    assert matching_topics("orders", names) == ["orders"]  # not a prefix match


def test_a_pattern_that_matches_nothing_is_an_error_naming_what_is_there():
    with pytest.raises(ConfigurationError, match=r"matches no topic on k:1 .*Topics there: payments") as info:
        matched_partitions(r"orders\..*", {"payments": [0], "__transaction_state": [0]}, "k:1")
    assert "__transaction_state" not in str(info.value) and not info.value.retriable


def test_every_partition_of_every_matching_topic_is_read():
    source = FakeSource({("orders.eu", 0): 5, ("orders.eu", 1): 5, ("orders.us", 0): 1, ("payments", 0): 9})
    assert partitions_to_read(source, [], r"orders\..*") == [("orders.eu", 0), ("orders.eu", 1), ("orders.us", 0)]
    assert partitions_to_read(source, ["payments"]) == [("payments", 0)]


def test_startup_mode_places_the_first_plan_and_a_topic_found_later_starts_at_its_earliest_offset():
    config = patterned(startup_mode="latest", new_partition_start="latest")
    log_starts = {("orders.eu", 0): 3, ("orders.eu", 1): 2, ("orders.us", 0): 4}
    ends = {tp: 10 for tp in log_starts}
    first = startup_positions(config, FakeSource(ends), [("orders.eu", 0)], log_starts, ends, first_run=True)
    assert first == {("orders.eu", 0): (10, "startup mode latest")}
    later = startup_positions(config, FakeSource(ends), [("orders.eu", 1), ("orders.us", 0)], log_starts, ends,
                              first_run=False, known_topics=["orders.eu"])
    # A new partition of a topic already read keeps new_partition_start; a new topic starts at its log start.
    assert later == {("orders.eu", 1): (10, "new partition, latest"), ("orders.us", 0): (4, DISCOVERED_TOPIC)}


def test_a_matched_topic_that_disappears_is_data_loss_and_a_pattern_that_no_longer_matches_is_a_new_flow():
    config = patterned()
    positions = {("orders.eu", 0): 4, ("orders.us", 0): 2}
    with pytest.raises(DataLossError, match=r"orders\.us\[0\] had committed offset 2 but no longer exists"):
        continuation_ranges(config, positions, [("orders.eu", 0)], {("orders.eu", 0): 0}, {("orders.eu", 0): 9})
    narrowed = pipeline_config("p", [], SINK, topic_pattern=r"orders\.eu")
    with pytest.raises(ConfigurationError, match=r"topics matching 'orders\\\\.eu' \(before"):
        continuation_ranges(narrowed, positions, [("orders.eu", 0)], {("orders.eu", 0): 0}, {("orders.eu", 0): 9})


def test_specific_offsets_name_partitions_of_matching_topics():
    config = patterned(startup_mode="specific_offsets", startup_offsets={"orders.eu": {0: 5}})
    assert config.startup_offsets == {"orders.eu:0": 5}
    with pytest.raises(ConfigurationError, match="a topic matching"):
        patterned(startup_mode="specific_offsets", startup_offsets={"payments": {0: 5}})


def test_registry_formats_over_a_pattern_name_their_subject():
    registry = {"url": "http://registry:8081"}
    with pytest.raises(ConfigurationError, match="value_subject='<subject>'"):
        patterned(value_format="avro", schema_registry=registry)
    assert patterned(value_format="avro", schema_registry=registry, value_subject="orders-value").value_subject


def test_the_report_lists_the_topics_batches_read_not_the_pattern():
    from airflow_exactly_once.observe.backlog import PipelineReport
    from airflow_exactly_once.core.model import OffsetRange
    from airflow_exactly_once.airflow_integration.lineage import input_topics

    config = patterned()
    report = PipelineReport("p", 0, config.to_stored_dict(), [], [], [], {("orders.eu", 0): 3}, {("orders.us", 1): 5},
                            {}, [], 0, None)
    assert report.topics == ["orders.eu", "orders.us"]
    assert report.reads == r"orders\..* (matched: orders.eu, orders.us)"
    batch = type("B", (), {"ranges": (OffsetRange("orders.us", 0, 0, 1), OffsetRange("orders.asia", 1, 0, 2))})()
    assert input_topics(config, batch) == ["orders.asia", "orders.us"] and input_topics(config, None) == []


def test_a_kafka_sink_topic_the_pattern_matches_is_refused_before_any_broker_is_asked():
    from airflow_exactly_once.sinks import create_committer

    config = pipeline_config("p", [], {"type": "kafka", "topic": "orders.enriched"}, topic_pattern=r"orders\..*")
    assert config.reads_topic("orders.enriched") and not config.reads_topic("orders")
    with pytest.raises(ConfigurationError, match="'orders.enriched' is also an input topic"):
        create_committer(config.sink).bind(config).check("p")


def test_the_ledger_page_names_the_pattern_and_the_topics_its_batches_read(tmp_path):
    from airflow_exactly_once.observe.backlog import read_pipeline
    from airflow_exactly_once.ui.loading import LagResult, PipelineSummary
    from airflow_exactly_once.ui.page import pipeline_page
    from tests.harness import MarkerWriter, Pipe, open_ledger

    config = pipeline_config("p-x", [], {"type": "parquet", "path": str(tmp_path / "out")}, topic_pattern=r"orders\..*")
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"),
                lambda: FakeSource({("orders.eu", 0): 4, ("orders.us", 0): 2, ("payments", 0): 9}),
                writer_factory=MarkerWriter.of)
    batch = pipe.plan("run-1").batch
    pipe.write(batch.id)
    pipe.commit(batch.id)
    report = read_pipeline(pipe.ledger, "p-x")
    page = pipeline_page(ledger="sqlite:///x.db", now=report.now, pipelines=[PipelineSummary("p-x", 1, {}, None)],
                         report=report, lag=LagResult([], ""), base="/ui")
    assert r"orders\..* (matched: orders.eu, orders.us) &rarr; parquet" in page and "payments" not in page


def test_the_backlog_trigger_takes_a_pattern_or_topics():
    from airflow_exactly_once.triggers.backlog import PipelineBacklogTrigger

    trigger = PipelineBacklogTrigger(pipeline_id="p", topic_pattern=r"orders\..*", bootstrap_servers="h:1")
    classpath, kwargs = trigger.serialize()
    assert PipelineBacklogTrigger(**kwargs).serialize() == (classpath, kwargs)
    assert kwargs["topic_pattern"] == r"orders\..*" and kwargs["topics"] == []
    with pytest.raises(ValueError, match="topics or its topic_pattern"):
        PipelineBacklogTrigger(pipeline_id="p", topics=["t"], topic_pattern="t.*")
    with pytest.raises(ConfigurationError, match="not a valid regular expression"):
        PipelineBacklogTrigger(pipeline_id="p", topic_pattern="orders.(")


def test_the_operators_take_a_pattern_and_a_templated_one_renders_empty_as_unset():
    from airflow_exactly_once.operators.batch import PlanBatchOperator

    plan = PlanBatchOperator(task_id="plan", pipeline_id="p", topic_pattern=r"orders\..*", sink=SINK,
                             kafka_conn_id=None, bootstrap_servers="h:1")
    config = plan.pipeline_config()
    assert config.topic_pattern == r"orders\..*" and config.topics == []
    listed = PlanBatchOperator(task_id="plan2", pipeline_id="p", topics="orders.eu", topic_pattern="", sink=SINK,
                               kafka_conn_id=None, bootstrap_servers="h:1")
    assert listed.pipeline_config().topic_pattern is None and listed.pipeline_config().topics == ["orders.eu"]
