"""Committables read the handles every earlier release wrote, and refuse newer ones by name.

The fixtures in tests/fixtures/handles are the ledger's handles column exactly as the release
before numbered formats wrote it (format version 1, no version key): they are never edited,
so a change of a committable's format that would misread a PREPARED batch left by that
release fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_exactly_once.core.errors import ConfigurationError, HandlesVersionError
from airflow_exactly_once.core.handles import VERSION_KEY
from airflow_exactly_once.core.sink import Committable, Handles
from airflow_exactly_once.sinks.dead_letters import DEAD_LETTER_HANDLES, PairedCommitter
from airflow_exactly_once.sinks.delta.committable import StagedFiles
from airflow_exactly_once.sinks.iceberg.committable import StagedSnapshot
from airflow_exactly_once.sinks.kafka.committable import KafkaCommittable, PartitionReport
from airflow_exactly_once.sinks.kafka.transaction_handle import TransactionHandle
from airflow_exactly_once.sinks.parquet.committable import StagedFolder
from airflow_exactly_once.sinks.parquet.sink_committer import ParquetSinkCommitter
from airflow_exactly_once.sinks.postgres.committable import PostgresCommittable

FIXTURES = Path(__file__).parents[1] / "fixtures" / "handles"
COMMITTABLES: dict[str, type[Committable]] = {"parquet": StagedFolder, "postgres": PostgresCommittable,
                                              "kafka": KafkaCommittable, "iceberg": StagedSnapshot}


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}-v1.json").read_text())


def test_the_fixtures_are_unnumbered_as_the_first_release_wrote_them():
    for name in [*COMMITTABLES, "dead-letter-parquet"]:
        handles = fixture(name)
        assert VERSION_KEY not in handles and VERSION_KEY not in (handles.get(DEAD_LETTER_HANDLES) or {}), name


def test_parquet_v1():
    assert StagedFolder.from_handles(fixture("parquet")) == StagedFolder(
        "/data/orders/_staging/batch-000000007-e2", "/data/orders/batch_seq=7",
        ("part-00000-5c1e.snappy.parquet", "part-00001-5c1e.snappy.parquet"))


def test_postgres_v1():
    assert PostgresCommittable.from_handles(fixture("postgres")) == PostgresCommittable(
        "public.orders", "upsert", 3, ("aeo.orders.b7.p0.a3", "aeo.orders.b7.p1.a3"), 12)


def test_iceberg_v1():
    staged = StagedSnapshot.from_handles(fixture("iceberg"))
    assert (staged.table, staged.wap_id, staged.snapshot_id) == ("db.orders", "orders-7-e2", 6023419735226512345)


def test_delta_v1_stamped_from_its_first_release():
    handles = fixture("delta")
    staged = StagedFiles.from_handles(handles)
    assert (staged.table, staged.folder) == ("/data/lake/orders", "_aeo_staging/orders/batch-000000007-e2")
    assert staged.files[1].endswith("day=2024-05-02/part-00001-5c1e.c000.snappy.parquet")
    assert staged.entries == ()  # version 1 kept the paths only: the commit reads their footers
    assert staged.to_handles() == {**{k: v for k, v in handles.items() if k != "records"}, "entries": [],
                                   VERSION_KEY: 2}
    assert StagedFiles.from_handles(staged.to_handles()) == staged  # written again in version 2: the same paths
    with pytest.raises(HandlesVersionError, match="StagedFiles handles in format version 3"):
        StagedFiles.from_handles({**handles, VERSION_KEY: 3})


def test_kafka_v1():
    read = KafkaCommittable.from_handles(fixture("kafka"))
    assert (read.guarantee, read.bootstrap_servers, read.topic) == ("EXACTLY_ONCE", "broker-1:9092,broker-2:9092",
                                                                     "orders-out")
    assert read.reports[0] == PartitionReport(
        0, 7, (("orders-out", 0, 1200), ("orders-out", 1, 840)),
        TransactionHandle("orders-7-0", 4001, 2, (("orders-out", 0), ("orders-out", 1))))
    assert read.reports[2].transaction == TransactionHandle("orders-7-2", 4003, 1, (), started=False)
    assert read.records == 12 and [r.transactional_id for r in read.transactions] == [
        "orders-7-0", "orders-7-1", "orders-7-2"]


def parquet_pair(tmp_path: Path) -> PairedCommitter:
    return PairedCommitter(ParquetSinkCommitter({"type": "parquet", "path": str(tmp_path / "out")}),
                           ParquetSinkCommitter({"type": "parquet", "path": str(tmp_path / "out" / "_dead_letter")}))


def test_dead_letter_pair_v1(tmp_path):
    read = parquet_pair(tmp_path).committable(fixture("dead-letter-parquet"))
    assert (read.output, read.dead_letters) == (
        StagedFolder("/data/orders/_staging/batch-000000007-e2", "/data/orders/batch_seq=7",
                     ("part-00000-5c1e.snappy.parquet",)),
        StagedFolder("/data/orders/_dead_letter/_staging/batch-000000007-e2", "/data/orders/_dead_letter/batch_seq=7",
                     ("part-00000-9a0b.snappy.parquet",)))


@pytest.mark.parametrize("name", sorted(COMMITTABLES))
def test_this_release_writes_v1_stamped_and_reads_it_back(name):
    committable = COMMITTABLES[name].from_handles(fixture(name))
    written = committable.to_handles()
    assert written[VERSION_KEY] == 1
    assert {k: v for k, v in written.items() if k != VERSION_KEY} == {
        k: v for k, v in fixture(name).items() if k != "records"}  # the v1 layout, only stamped
    assert COMMITTABLES[name].from_handles(written) == committable


def test_each_part_of_a_pair_carries_its_own_version(tmp_path):
    pair = parquet_pair(tmp_path).committable(fixture("dead-letter-parquet"))
    written = pair.to_handles()
    assert written[VERSION_KEY] == 1 and written[DEAD_LETTER_HANDLES][VERSION_KEY] == 1
    assert parquet_pair(tmp_path).committable(written) == pair


@pytest.mark.parametrize("name", sorted(COMMITTABLES))
def test_a_newer_version_is_refused_naming_both_versions_and_the_fix(name):
    cls = COMMITTABLES[name]
    with pytest.raises(HandlesVersionError) as refused:
        cls.from_handles({**fixture(name), VERSION_KEY: cls.handles_version + 1})
    message = str(refused.value)
    assert refused.value.retriable is False and isinstance(refused.value, ConfigurationError)
    assert cls.__name__ in message and f"version {cls.handles_version + 1}" in message
    assert "reads version 1 only" in message and "Upgrade airflow-exactly-once on this worker" in message


def test_a_newer_dead_letter_part_is_refused_by_its_own_committable(tmp_path):
    handles = fixture("dead-letter-parquet")
    handles[DEAD_LETTER_HANDLES][VERSION_KEY] = 2
    with pytest.raises(HandlesVersionError, match="StagedFolder handles in format version 2"):
        parquet_pair(tmp_path).committable(handles)


@pytest.mark.parametrize("version", [0, "2", True, None, 1.5])
def test_a_version_no_release_writes_is_refused(version):
    with pytest.raises(HandlesVersionError, match="which no release writes"):
        StagedFolder.from_handles({**fixture("parquet"), VERSION_KEY: version})


class Renamed(Committable):
    """A committable whose second format renamed its one field: both formats stay readable."""

    handles_version = 2

    def __init__(self, where: str) -> None:
        self.where = where

    def write_handles(self) -> Handles:
        return {"location": self.where}

    @classmethod
    def read_handles_v1(cls, handles: Handles) -> "Renamed":
        return cls(handles["path"])

    @classmethod
    def read_handles_v2(cls, handles: Handles) -> "Renamed":
        return cls(handles["location"])


def test_each_version_goes_to_its_own_reader():
    assert Renamed("/a").to_handles() == {"location": "/a", VERSION_KEY: 2}
    assert Renamed.from_handles({"path": "/old"}).where == "/old"  # unnumbered: version 1
    assert Renamed.from_handles({"location": "/new", VERSION_KEY: 2}).where == "/new"
    with pytest.raises(HandlesVersionError, match="reads versions 1 to 2"):
        Renamed.from_handles({"location": "/newer", VERSION_KEY: 3})


def test_a_committable_without_a_reader_for_a_version_it_wrote_is_refused_when_defined():
    with pytest.raises(TypeError, match="read_handles_v2"):
        class Forgetful(Committable):  # noqa: F841 - defining it is the test
            handles_version = 2

            def write_handles(self) -> Handles:
                return {}

            @classmethod
            def read_handles_v1(cls, handles: Handles) -> "Forgetful":
                return cls()
    with pytest.raises(TypeError, match="write_handles"):
        class Mute(Committable):  # noqa: F841
            @classmethod
            def read_handles_v1(cls, handles: Handles) -> "Mute":
                return cls()
