"""OpenLineage: the dataset names each sink gives (core/lineage_names.py, SinkCommitter.lineage_dataset), what a step
reports (airflow_integration/lineage.py), that no secret reaches it, and nothing without the extra. Through a
real Airflow with the OpenLineage provider: tests/system/test_lineage_airflow.py.
"""

from __future__ import annotations

import json
import sys

import pytest

from airflow_exactly_once.airflow_integration import compat, lineage
from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.lineage_names import DatasetName, file_dataset, kafka_dataset, postgres_dataset
from airflow_exactly_once.core.model import Batch, OffsetRange
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.operators.batch import AbortBatchOperator
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import create_committer, pipeline_committer
from airflow_exactly_once.sinks.dead_letters import lineage_outputs


@pytest.mark.parametrize("location, expected", [
    ("/data/out", DatasetName("file", "/data/out")),
    ("file:///data/out", DatasetName("file", "/data/out")),
    ("s3a://key:SECRET@bucket/lake/t", DatasetName("s3://bucket", "lake/t")),
    ("gs://bucket/lake", DatasetName("gs://bucket", "lake")),
    ("hdfs://namenode:8020/lake", DatasetName("hdfs://namenode:8020", "/lake")),
    ("abfss://container@acct.dfs.core.windows.net/lake", DatasetName("abfss://container@acct.dfs.core.windows.net",
                                                                     "lake")),
])
def test_file_names_follow_the_openlineage_naming(location, expected):
    assert file_dataset(location) == expected


def test_topic_and_table_names_follow_the_openlineage_naming():
    assert kafka_dataset("b1:9092, b2:9092", "orders") == DatasetName("kafka://b1:9092", "orders")
    assert kafka_dataset("SASL_SSL://b1:9093", "orders") == DatasetName("kafka://b1:9093", "orders")
    assert postgres_dataset("postgresql+psycopg2://u:SECRET@db:5433/shop", "sales.orders") == DatasetName(
        "postgres://db:5433", "shop.sales.orders")
    assert postgres_dataset("postgresql://db/shop", "orders") == DatasetName("postgres://db:5432", "shop.public.orders")


def test_each_sink_names_where_it_writes(tmp_path):
    config = checked(PipelineConfig(pipeline_id="p", topics=["t"], sink={"type": "parquet", "path": str(tmp_path)},
                                    bootstrap_servers="k:9092"))
    assert create_committer({"type": "parquet", "path": str(tmp_path)}).lineage_dataset() == DatasetName("file",
                                                                                                   str(tmp_path))
    assert create_committer({"type": "kafka", "topic": "out"}).bind(config).lineage_dataset() == DatasetName(
        "kafka://k:9092", "out")  # the pipeline's cluster
    assert create_committer({"type": "postgres", "url": "postgresql://u:pw@db:5432/shop", "table": "t"}) \
        .lineage_dataset() == DatasetName("postgres://db:5432", "shop.public.t")
    assert create_committer({"type": "iceberg", "table": "db.events", "warehouse": "s3://bucket/lake",
                        "catalog": {"type": "postgres", "url": "postgresql://u:pw@h/cat"}}) \
        .lineage_dataset() == DatasetName("s3://bucket", "lake/db/events")


SECRETS = ("SASL-SECRET", "PG-SECRET", "DLQ-SECRET")


def secret_config() -> PipelineConfig:
    return checked(PipelineConfig(
        pipeline_id="orders", topics=["orders"], bootstrap_servers="k1:9092,k2:9092",
        kafka_config={"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u",
                      "sasl.password": SECRETS[0]},
        sink={"type": "postgres", "url": f"postgresql://u:{SECRETS[1]}@db:5432/shop", "table": "orders"},
        dead_letter={"type": "kafka", "topic": "orders-dlq",
                     "kafka_config": {"bootstrap.servers": "k3:9092", "sasl.password": SECRETS[2]}},
        bad_record_policy="dead_letter"))


def step_lineage(config: PipelineConfig, batch: Batch | None, recovered: list[str] | None = None):
    """A step's lineage with what the pipeline writes named as the operators name it."""
    return lineage.step_lineage(config, lineage_outputs(pipeline_committer(config).bind(config)), batch, recovered)


def serialized(found) -> str:
    from openlineage.client.serde import Serde

    return json.dumps([Serde.to_dict(d) for d in found.inputs + found.outputs]
                      + [Serde.to_dict(f) for f in found.run_facets.values()])


def test_a_step_reports_topics_sink_dead_letters_and_its_batch_and_no_secret():
    batch = Batch("orders", 7, "run", BatchState.COMMITTED, 3, (OffsetRange("orders", 0, 10, 25),),
                  input_records=15, output_records=13, details={"bad_records": {"count": 2, "policy": "dead_letter"}})
    found = step_lineage(secret_config(), batch, ["orders:6"])
    events = json.loads(serialized(found))
    assert [(d["namespace"], d["name"]) for d in events[:3]] == [
        ("kafka://k1:9092", "orders"), ("postgres://db:5432", "shop.public.orders"), ("kafka://k3:9092", "orders-dlq")]
    assert events[0]["inputFacets"]["inputStatistics"]["rowCount"] == 15
    assert [e["outputFacets"]["outputStatistics"]["rowCount"] for e in events[1:3]] == [13, 2]
    facet = events[3]
    assert {k: v for k, v in facet.items() if not k.startswith("_")} == {
        "pipelineId": "orders", "batchId": "orders:7", "batchSeq": 7, "state": "COMMITTED",
        "ranges": [{"topic": "orders", "partition": 0, "start": 10, "end": 25}], "inputRecords": 15,
        "outputRecords": 13, "badRecords": 2, "recoveredBatches": ["orders:6"]}
    assert not [s for s in SECRETS if s in serialized(found)]


def test_before_its_batch_a_step_reports_the_datasets_only():
    found = step_lineage(secret_config(), None)
    facet = found.run_facets[lineage.FACET_NAME]
    assert (facet.pipelineId, facet.batchId, facet.ranges) == ("orders", None, [])
    assert [o.outputFacets for o in found.outputs] == [{}, {}] and found.inputs[0].inputFacets == {}


def test_a_step_reports_the_batch_its_execute_recorded_and_reading_the_batch_id_records_nothing(tmp_path):
    """The OpenLineage methods report what execute recorded; resolved_batch_id() is a pure accessor."""
    common = dict(pipeline_id="p", topics="t", sink={"type": "parquet", "path": str(tmp_path / "out")},
                  bootstrap_servers="127.0.0.1:9", ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger = AbortBatchOperator(task_id="setup", **common).coordinator().ledger
    config = PipelineConfig(**{k: v for k, v in common.items() if k != "ledger_url"})
    ledger.ensure_pipeline("p", config.fingerprint(), config.to_dict())
    batch = ledger.create_batch("p", "run1", [OffsetRange("t", 0, 0, 5)], expected_epoch=ledger.pipeline("p")["epoch"])
    abort = AbortBatchOperator(task_id="abort", batch_id=str(batch.id), **common)

    assert abort.resolved_batch_id() == batch.id
    assert abort.get_openlineage_facets_on_complete(None).run_facets[lineage.FACET_NAME].batchId is None
    abort.execute({"run_id": "run1"})
    facet = abort.get_openlineage_facets_on_complete(None).run_facets[lineage.FACET_NAME]
    assert (facet.batchId, facet.state) == (str(batch.id), "ABORTED")


def test_without_the_openlineage_extra_nothing_is_reported(monkeypatch):
    for name in list(sys.modules):
        if name == "openlineage" or name.startswith("openlineage."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "openlineage", None)  # as if the extra were not installed
    assert compat.openlineage() is None
    assert step_lineage(secret_config(), None) is None
