"""The Iceberg sink's pure rules: its spec, its catalog settings, how batches show in snapshots, and the decisions
the committer takes from them (publish how, already published, what to drop, whether a batch can be withdrawn)."""

from __future__ import annotations

import pytest

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.sinks import create_committer, create_writer
from airflow_exactly_once.sinks.iceberg import snapshots as snaps
from airflow_exactly_once.sinks.iceberg.catalog import CatalogSpec
from airflow_exactly_once.sinks.iceberg.committable import StagedSnapshot
from airflow_exactly_once.sinks.iceberg.runtime import ICEBERG_RELEASE, ICEBERG_SPARK_RUNTIME
from airflow_exactly_once.spark import packages as spark_packages


def spec(**overrides):
    return {"type": "iceberg", "table": "db.events", "warehouse": "/data/lake", **overrides}


def test_a_valid_spec_names_table_catalog_and_packages():
    sink = create_writer(spec())
    target = sink.target
    assert (target.namespace, target.table_name, target.spark_table) == ("db", "events", "`iceberg`.`db`.`events`")
    assert target.catalog == CatalogSpec("iceberg", "embedded", "file:///data/lake",
                                       "sqlite:////data/lake/_iceberg_catalog.sqlite")
    assert create_committer(spec()).supports_retract and not target.create_table
    packages = [spark_packages.for_installed_spark(p, "4.0.0", "2.13") for p in sink.spark_packages()]
    assert packages[0] == f"org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:{ICEBERG_RELEASE}"
    assert packages[1].startswith("org.xerial:sqlite-jdbc:")


@pytest.mark.parametrize("bad, message", [
    ({"table": "events"}, "namespace.name"),
    ({"table": "a.b.c"}, "namespace.name"),
    ({"warehouse": None}, "needs a 'warehouse'"),
    ({"warehouse": "relative/path"}, "absolute"),
    ({"catalog": {"type": "hive"}}, "not supported"),
    ({"catalog": {"type": "postgres"}}, "exactly one of 'conn_id'"),
    ({"catalog": {"type": "postgres", "url": "mysql://h/db"}}, "postgresql://"),
    ({"catalog": {"name": "9lives"}}, "Spark identifier"),
    ({"catalog": {"conn_id": "x"}}, "takes 'name', 'path' and 'properties'"),
    ({"warehouse": "s3://bucket/lake"}, "SQLite file under a local warehouse"),
    ({"create_table": "yes"}, "True or False"),
    ({"partitioned_by": [1]}, "column names"),
    ({"mode": "upsert"}, "the iceberg sink has no setting 'mode'"),
])
def test_a_bad_spec_says_what_to_change(bad, message):
    with pytest.raises(ConfigurationError, match=message):
        create_committer(spec(**bad))


def test_the_catalog_is_the_same_for_spark_and_pyiceberg():
    embedded = CatalogSpec.from_spec(spec(catalog={"name": "lake"}))
    conf = embedded.spark_conf()
    assert conf["spark.sql.catalog.lake"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.lake.uri"] == "jdbc:sqlite:/data/lake/_iceberg_catalog.sqlite"
    assert conf["spark.sql.catalog.lake.jdbc.init-catalog-tables"] == "false"
    assert embedded.database_url() == "sqlite:////data/lake/_iceberg_catalog.sqlite"
    pg = CatalogSpec.from_spec(spec(catalog={"type": "postgres", "url": "postgresql://u:secret@db:5433/cat"}))
    conf = pg.spark_conf()
    assert conf["spark.sql.catalog.iceberg.uri"] == "jdbc:postgresql://db:5433/cat"
    assert (conf["spark.sql.catalog.iceberg.jdbc.user"], conf["spark.sql.catalog.iceberg.jdbc.password"]) == \
        ("u", "secret")
    assert pg.database_url() == "postgresql+psycopg2://u:secret@db:5433/cat"
    assert "secret" not in pg.describe() and "db:5433/cat" in pg.describe()
    assert pg.jdbc_package().startswith("org.postgresql:postgresql:")
    assert "connection 'cat_conn'" in CatalogSpec.from_spec(
        spec(catalog={"type": "postgres", "conn_id": "cat_conn"})).describe()


def test_snapshot_names_carry_the_batch_and_the_attempt():
    assert snaps.wap_id("orders", 7, 12) == "aeo:orders:7:e12"
    summary = snaps.batch_summary("orders", 7, 12, "manual__1")
    assert summary == {"aeo.batch": "orders:7", "aeo.pipeline": "orders", "aeo.batch-seq": "7", "aeo.attempt": "12",
                       "aeo.run-id": "manual__1"}
    staged = StagedSnapshot("db.events", "aeo:orders:7:e12", 123)
    assert StagedSnapshot.from_handles(staged.to_handles()) == staged
    assert StagedSnapshot.from_handles({"table": "db.t", "wap_id": "w", "snapshot_id": None}).snapshot_id is None


def view(snapshot_id, parent=None, batch=None, pipeline="p", **extra):
    summary = {**({"aeo.batch": batch, "aeo.pipeline": pipeline} if batch else {}), **extra}
    return snaps.SnapshotView(snapshot_id, parent, summary)


def test_a_batch_is_published_when_main_history_carries_its_id():
    history = [view(3, 2, "p:2"), view(2, 1, "p:1"), view(1)]
    assert snaps.find_published(history, "p:1").snapshot_id == 2
    assert snaps.find_published(history, "p:3") is None
    retraction = [view(4, 3, None, **{"aeo.retracts": "p:3"})]
    assert snaps.find_published(retraction, "p:3") is None  # withdrawing a batch is not publishing it


def test_fast_forward_only_when_main_has_not_moved():
    assert snaps.publish_mode(5, 5) == snaps.FAST_FORWARD
    assert snaps.publish_mode(None, None) == snaps.FAST_FORWARD  # the table's first snapshot
    assert snaps.publish_mode(5, 6) == snaps.CHERRY_PICK
    assert snaps.publish_mode(None, 6) == snaps.CHERRY_PICK


def test_leftovers_are_dead_attempts_never_main_refs_or_other_batches():
    all_snapshots = [view(1, None, "p:1"), view(2, 1, "p:2"), view(10, 1, "p:2"),  # 10: a fenced attempt of batch 2
                     view(11, 1, "p:3"),  # batch 3, still staged (parallel interval): not ours to drop
                     view(12, 1, "p:1"),  # a zombie attempt of published batch 1
                     view(13, 1, "q:2", pipeline="q"),  # another pipeline's
                     view(14, 1, "p:2")]  # a branch head (someone's audit branch): never dropped
    main_ids, heads = {1, 2}, {2, 14}
    assert snaps.leftovers(all_snapshots, main_ids, heads, "p", {"p:2"}, {"p:1", "p:2"}) == [10, 12]
    assert snaps.leftovers(all_snapshots, main_ids, heads, "p", {"p:3"}, {"p:1"}) == [11, 12]


def test_a_batch_can_be_withdrawn_exactly_only_while_its_files_are_live():
    assert snaps.withdrawal({"a", "b"}, {"a", "b", "c"}) == "all"
    assert snaps.withdrawal({"a", "b"}, {"c"}) == "done"
    assert snaps.withdrawal({"a", "b"}, {"a", "c"}) == "partial"  # compaction rewrote b


def test_the_sinks_packages_join_kafkas_unless_the_user_names_them(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.setattr(spark_packages, "spark_version", lambda: "4.0.0")  # a line Iceberg has a runtime for
    assert spark_packages.artifact_of("org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.10.1") == \
        "iceberg-spark-runtime-4.0"
    assert spark_packages.artifact_of("org.xerial:sqlite-jdbc:3.50.3.0") == "sqlite-jdbc"
    with pytest.raises(ValueError):
        spark_packages.artifact_of("sqlite-jdbc")
    # Whoever hands a sink's packages to Spark gets its templates completed (a benchmark once passed them raw).
    runtime = spark_packages.with_connectors({}, [ICEBERG_SPARK_RUNTIME])["spark.jars.packages"].split(",")[1]
    assert runtime == spark_packages.iceberg_package()
    iceberg = spark_packages.iceberg_package("4.0.0", "2.13")
    assert iceberg == f"org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:{ICEBERG_RELEASE}"
    conf = spark_packages.with_connectors({}, [iceberg, "org.xerial:sqlite-jdbc:3.50.3.0"])
    assert conf["spark.jars.packages"].split(",") == [spark_packages.kafka_package(), iceberg,
                                                      "org.xerial:sqlite-jdbc:3.50.3.0"]
    own = spark_packages.with_connectors({"spark.jars": "/j/iceberg-spark-runtime-4.0_2.13-1.9.0.jar"}, [iceberg])
    assert own["spark.jars.packages"] == spark_packages.kafka_package()  # the user's Iceberg jar wins
    (tmp_path / "spark-defaults.conf").write_text(
        "spark.jars /j/spark-sql-kafka-0-10_2.13-4.0.0.jar,/j/iceberg-spark-runtime-4.0_2.13.jar\n")
    assert spark_packages.with_connectors({}, [iceberg]) == {}
