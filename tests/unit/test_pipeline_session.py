"""Which Spark Connect session a write attempt uses: its pipeline's shared one while the shipped code is the same."""

from __future__ import annotations

import zipfile

import pytest

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.operators.batch import WriteBatchOperator
from airflow_exactly_once.sinks import pipeline_writer
from airflow_exactly_once.spark.connect_server.pipeline_session import (
    BUNDLE_DETAIL,
    attempt_tag,
    bundle_digest,
    reusable_session,
    shares_session,
)
from airflow_exactly_once.spark.connect_server.session import SESSION_DETAIL, TAG_DETAIL
from tests.harness import pipeline_config


class FakeLedger:
    def __init__(self, *batches: Batch) -> None:
        self.batches = {b.id: b for b in batches}

    def find_batch(self, batch_id: BatchId) -> Batch | None:
        return self.batches.get(batch_id)


def batch(seq: int, **details) -> Batch:
    return Batch("p", seq, f"run-{seq}", BatchState.COMMITTED, 1, (), details=details)


SHARED = {SESSION_DETAIL: "s-1", TAG_DETAIL: "aeo-p-1-abc", BUNDLE_DETAIL: "d1"}


def test_the_previous_batchs_shared_session_is_reused_when_it_ran_the_same_code():
    assert reusable_session(FakeLedger(batch(1, **SHARED)), BatchId("p", 2), "d1") == "s-1"


def test_other_code_a_session_of_its_own_or_no_previous_batch_means_a_new_session():
    assert reusable_session(FakeLedger(batch(1, **SHARED)), BatchId("p", 2), "d2") is None  # other code
    own = {SESSION_DETAIL: "s-1"}  # an Iceberg write's session, released after it
    assert reusable_session(FakeLedger(batch(1, **own)), BatchId("p", 2), "d1") is None
    assert reusable_session(FakeLedger(), BatchId("p", 2), "d1") is None  # pruned by retention
    assert reusable_session(FakeLedger(batch(1, **SHARED)), BatchId("p", 1), "d1") is None  # the first batch
    assert reusable_session(FakeLedger(batch(1, **SHARED)), BatchId("p", 3), "d1") is None  # only the previous one


def test_every_attempt_gets_a_tag_of_its_own():
    tags = {attempt_tag(BatchId("p", 7)) for _ in range(50)}
    assert len(tags) == 50 and all(tag.startswith("aeo-p-7-") and "," not in tag for tag in tags)


def test_the_digest_follows_the_shipped_bytes(tmp_path):
    def bundle(name: str, text: str):
        path = tmp_path / name
        with zipfile.ZipFile(path, "w") as archive:
            info = zipfile.ZipInfo("m.py", date_time=(2024, 1, 1, 0, 0, 0))
            archive.writestr(info, text)
        return path

    assert bundle_digest(bundle("a.zip", "x = 1\n")) == bundle_digest(bundle("b.zip", "x = 1\n"))
    assert bundle_digest(bundle("c.zip", "x = 2\n")) != bundle_digest(bundle("a.zip", "x = 1\n"))


def writer(sink: dict, **overrides):
    return pipeline_writer(pipeline_config("p", ["t"], sink, "127.0.0.1:9", **overrides))


def test_only_writes_that_change_the_session_settings_get_a_session_of_their_own(tmp_path):
    assert not writer({"type": "kafka", "topic": "out"}).changes_session_conf
    assert not writer({"type": "parquet", "path": str(tmp_path / "out")}).changes_session_conf
    iceberg = {"type": "iceberg", "table": "db.t", "warehouse": str(tmp_path / "lake")}
    assert writer(iceberg).changes_session_conf
    assert writer({"type": "delta", "path": str(tmp_path / "d")}).changes_session_conf
    # a dead-letter destination that changes them makes the pair change them
    assert writer({"type": "parquet", "path": str(tmp_path / "o")}, bad_record_policy="dead_letter",
                  dead_letter={"type": "iceberg", "table": "db.dl", "warehouse": str(tmp_path / "lake")}
                  ).changes_session_conf


def test_a_dag_that_asks_for_a_session_per_attempt_gets_one_and_a_misspelt_choice_is_refused(tmp_path):
    parquet = writer({"type": "parquet", "path": str(tmp_path / "out")})
    assert shares_session(True, parquet) and not shares_session(False, parquet)
    assert not shares_session(True, writer({"type": "delta", "path": str(tmp_path / "d")}))
    with pytest.raises(ConfigurationError, match=r"spark_connect_session='per_attempt' is not supported; choose one "
                                                 r"of 'pipeline', 'attempt'"):
        WriteBatchOperator(task_id="write", pipeline_id="p", topics="t", sink={"type": "kafka", "topic": "o"},
                           spark_connect_session="per_attempt")
    assert WriteBatchOperator(task_id="write", pipeline_id="p", topics="t", sink={"type": "kafka", "topic": "o"}
                              ).spark_connect_session == "pipeline"
