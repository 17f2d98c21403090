"""The Delta sink's pure rules: its spec, where attempts stage, partition values from Hive folders, the table
features it can write, schema comparison, withdrawal, and Delta statistics from a Parquet footer."""

from __future__ import annotations

import datetime
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.lineage_names import file_dataset
from airflow_exactly_once.sinks import create_committer, create_writer, spec_type
from airflow_exactly_once.sinks.delta import commits, runtime
from airflow_exactly_once.sinks.delta.commits import TableFeatures
from airflow_exactly_once.sinks.delta.committable import StagedFile, StagedFiles
from airflow_exactly_once.sinks.delta.conditional_put import honours_conditional_put
from airflow_exactly_once.sinks.delta.object_folder import ObjectFolder, delta_storage_options
from airflow_exactly_once.sinks.delta.partition_writer import value_runs
from airflow_exactly_once.sinks.delta.s3_sink_writer import S3DeltaSinkWriter
from airflow_exactly_once.sinks.delta.sink_committer import DeltaSinkCommitter
from airflow_exactly_once.sinks.delta.sink_writer import DeltaSinkWriter
from airflow_exactly_once.sinks.delta.stats import file_stats
from airflow_exactly_once.sinks.delta.target import DeltaTarget
from airflow_exactly_once.sinks.delta.withdrawn import WithdrawnFolders
from airflow_exactly_once.storage.s3_client import S3Access


def spec(**overrides):
    return {"type": "delta", "path": "/data/lake/events", **overrides}


def test_a_valid_spec_names_the_folder_and_needs_no_spark_package():
    writer = create_writer(spec(partitioned_by="day", table_properties={"delta.checkpointInterval": 10}))
    assert str(writer.target.root) == "/data/lake/events" and writer.target.partitioned_by == ("day",)
    assert writer.target.table_properties == {"delta.checkpointInterval": "10"}
    assert writer.spark_packages() == []  # delta-rs creates and commits: Spark writes plain Parquet
    committer = create_committer(spec(path="file:///data/lake/events/"))
    assert committer.supports_retract and str(committer.target.root) == "/data/lake/events"
    assert committer.lineage_dataset().name == "/data/lake/events"


@pytest.mark.parametrize("bad, message", [
    ({"path": None}, "needs a 'path'"),
    ({"path": "relative/t"}, "absolute"),
    ({"path": "gs://bucket/t"}, "not supported for object storage; supported: s3://, s3a://"),
    ({"path": "s3://bucket"}, "a bucket's root"),
    ({"path": "s3://bucket/t", "single_writer": "yes"}, "single_writer must be True or False"),
    ({"create_table": "yes"}, "True or False"),
    ({"partitioned_by": [1]}, "list of column names"),
    ({"partiton_by": ["day"]}, "did you mean 'partitioned_by'"),
])
def test_a_bad_spec_is_refused_with_the_fix(bad, message):
    with pytest.raises(ConfigurationError, match=message):
        create_committer(spec(**bad))


def test_dead_letters_go_to_a_delta_table_of_their_own_under_the_output():
    assert spec_type(spec()).dead_letter_beside(spec()) == {
        "type": "delta", "path": "/data/lake/events/_dead_letter", "create_table": True}
    on_s3 = spec(path="s3://lake/events", aws_conn_id="lake", single_writer=True)
    assert spec_type(on_s3).dead_letter_beside(on_s3) == {
        "type": "delta", "path": "s3://lake/events/_dead_letter", "create_table": True, "aws_conn_id": "lake",
        "single_writer": True}


def test_an_object_storage_path_picks_the_s3_writer_and_the_same_committer():
    on_s3 = spec(path="s3a://lake/events/", aws_conn_id="lake")
    writer, committer = create_writer(on_s3), create_committer(on_s3)
    assert type(writer) is S3DeltaSinkWriter and type(committer) is DeltaSinkCommitter
    assert writer.target.root == "s3://lake/events" and isinstance(committer.target.folder, ObjectFolder)
    assert committer.lineage_dataset() == file_dataset("s3://lake/events")  # as the parquet sink's s3 layout names it
    assert type(create_writer(spec())) is DeltaSinkWriter


def test_delta_rs_storage_options_come_from_the_connection_and_never_waive_safety_unasked():
    access = S3Access("http://127.0.0.1:9000", None, "key-id", "the-secret")
    options = delta_storage_options(access, single_writer=False)
    assert options == {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true",
                       "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false", "AWS_REGION": "us-east-1",
                       "AWS_ACCESS_KEY_ID": "key-id", "AWS_SECRET_ACCESS_KEY": "the-secret"}
    assert delta_storage_options(access, single_writer=True)["AWS_S3_ALLOW_UNSAFE_RENAME"] == "true"
    assert delta_storage_options(S3Access(region_name="eu-west-1"), False) == {"AWS_REGION": "eu-west-1"}  # own chain


@pytest.mark.parametrize("answer, honoured", [("PreconditionFailed", True), ("412", True), (None, False),
                                              ("NotImplemented", False), ("501", False)])
def test_only_a_store_that_refuses_an_overwriting_conditional_put_counts_as_safe(answer, honoured):
    assert honours_conditional_put(answer) is honoured


def test_partition_values_written_as_hive_folders_read_back_as_delta_values():
    values = {"part": commits.partition_text("x:y/z"), "n": commits.partition_text(7),
              "flag": commits.partition_text(False), "day": commits.partition_text(datetime.date(2024, 5, 1)),
              "gone": commits.partition_text(None)}
    assert values == {"part": "x:y/z", "n": "7", "flag": "false", "day": "2024-05-01", "gone": None}
    folder = commits.hive_folder(values)
    assert folder.count("/") == len(values)  # the slash inside a value is escaped
    assert commits.partition_values(f"{folder}part-0.parquet", list(values)) == values


def test_rows_sorted_by_partition_columns_split_into_one_run_per_value():
    batch = pa.record_batch({"p": ["a", "a", None, None, "b"], "q": [1, 1, 1, 2, 2], "v": list("vwxyz")})
    assert value_runs(batch, ("p",)) == [(0, 2), (2, 4), (4, 5)]
    assert value_runs(batch, ("p", "q")) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert value_runs(batch, ()) == [(0, 5)] and value_runs(batch.slice(0, 0), ("p",)) == []


def test_a_committable_keeps_each_file_description_and_reads_the_old_format():
    entry = StagedFile("_aeo_staging/p/batch-000000001-e1/part=a/f.parquet", 10, 2, '{"numRecords":2}',
                       (("part", "a"),), 1000)
    staged = StagedFiles.described("s3://lake/t", "_aeo_staging/p/batch-000000001-e1", [entry])
    again = StagedFiles.from_handles(staged.to_handles())
    assert again == staged and again.entries == (entry,) and again.records == 2
    old = StagedFiles.from_handles({"table": "/t", "folder": "f", "files": ["f/a.parquet"], "handles_version": 1})
    assert old.files == ("f/a.parquet",) and old.entries == ()
    assert StagedFiles.from_handles(old.to_handles()) == old  # written again: still the paths


def test_attempts_stage_in_folders_of_their_own_and_the_batch_is_its_transaction():
    assert commits.attempt_folder("orders", 7, 3) == "_aeo_staging/orders/batch-000000007-e3"
    assert commits.attempt_folder("orders", 7, 3).startswith(commits.batch_prefix("orders", 7))
    assert not commits.attempt_folder("orders", 70, 3).startswith(commits.batch_prefix("orders", 7))
    assert commits.app_id("orders", 7) != commits.app_id("orders", 8)
    assert commits.commit_metadata("orders", 7, 3, "run-1") == {
        "aeo.batch": "orders:7", "aeo.pipeline": "orders", "aeo.batch-seq": "7", "aeo.attempt": "3",
        "aeo.run-id": "run-1"}


def test_partition_values_come_from_spark_hive_folders_unescaped():
    path = "day=2024-05-01/city=New%3AYork/part-00000.parquet"
    assert commits.partition_values(path, ["day", "city"]) == {"day": "2024-05-01", "city": "New:York"}
    assert commits.partition_values(f"day={commits.HIVE_NULL}/p.parquet", ["day"]) == {"day": None}
    assert commits.partition_values("part-0.parquet", []) == {}
    with pytest.raises(ValueError, match="no folder for partition"):
        commits.partition_values("part-0.parquet", ["day"])


def test_only_partition_types_whose_folder_text_is_the_delta_value_are_staged():
    types = {"day": "date", "n": "long", "t": "timestamp", "x": "double", "s": "string"}
    assert commits.partition_type_problems(["day", "n", "s"], types) == []
    assert commits.partition_type_problems(["t", "x"], types) == ["t (timestamp)", "x (double)"]


def features(reader=1, writer=2, readers=(), writers=(), configuration=None, keys=()):
    return TableFeatures(reader, writer, tuple(readers), tuple(writers), configuration or {}, frozenset(keys))


def test_the_default_protocols_of_spark_and_delta_rs_are_writable():
    assert commits.unwritable_features(features()) == []  # (1, 2): appendOnly, invariants unused
    assert commits.unwritable_features(features(1, 4, configuration={"delta.enableChangeDataFeed": "true"})) == []
    assert commits.unwritable_features(features(3, 7, ["timestampNtz"], ["timestampNtz", "appendOnly"])) == []


@pytest.mark.parametrize("table, named", [
    (features(3, 7, ["deletionVectors"], ["deletionVectors", "appendOnly"]), "deletionVectors"),
    (features(1, 7, writers=["rowTracking", "domainMetadata"]), "rowTracking"),
    (features(2, 5, configuration={"delta.columnMapping.mode": "name"}), "columnMapping"),
    (features(1, 3, configuration={"delta.constraints.positive": "id > 0"}), "checkConstraints"),
    (features(1, 2, keys={"delta.invariants"}), "invariants"),
    (features(1, 4, keys={"delta.generationExpression"}), "generatedColumns"),
    (features(1, 6, keys={"delta.identity.start"}), "identityColumns"),
])
def test_a_feature_the_committer_cannot_honour_is_named(table, named):
    problems = commits.unwritable_features(table)
    assert any(p.startswith(named) for p in problems), problems


def test_legacy_versions_only_count_features_a_table_uses():
    assert commits.unwritable_features(features(2, 5, configuration={"delta.columnMapping.mode": "none"})) == []
    assert commits.unwritable_features(features(1, 6)) == []


def field(name, type_, nullable=True):
    return {"name": name, "type": type_, "nullable": nullable, "metadata": {}}


def test_schemas_compare_names_case_insensitively_and_types_exactly():
    table = [field("id", "long", False), field("Value", "string"), field("tags", {"type": "array",
                                                                                  "elementType": "string",
                                                                                  "containsNull": False})]
    same = [field("ID", "long"), field("value", "string"), field("tags", {"type": "array", "elementType": "string",
                                                                          "containsNull": True})]
    assert commits.schema_problems(table, same) == []
    assert commits.schema_problems(table, [field("id", "integer"), field("extra", "string")]) == [
        "column extra is not in the table", "column Value is missing", "column tags is missing",
        "column id is integer in the output, long in the table"]
    assert commits.not_null_columns(table) == ["id"]


def test_a_batch_is_withdrawn_whole_or_refused_when_compaction_rewrote_part_of_it():
    assert commits.withdrawable({"a", "b"}, {"a", "b", "other"}) == {"a", "b"}
    assert commits.withdrawable({"a", "b"}, {"other"}) == set()
    assert commits.withdrawable({"a", "b"}, {"a", "other"}) is None


@pytest.mark.parametrize("text, expected", [
    (None, 7 * 86_400_000),  # Delta's default: a week
    ("interval 1 week", 7 * 86_400_000),
    ("interval 168 hours", 7 * 86_400_000),
    ("2 days", 2 * 86_400_000),
    ("INTERVAL 1 day 12 hours", 36 * 3_600_000),
    ("interval 1 second", 1000),
    ("interval 0 seconds", 0),
    ("interval 1 month", None),  # Delta refuses months for it: the sink then deletes nothing
    ("interval one week", None),
    ("interval 1", None),
])
def test_the_retention_of_removed_files_is_read_as_delta_writes_it(text, expected):
    configuration = {} if text is None else {commits.RETENTION_PROPERTY: text}
    assert commits.deleted_file_retention_ms(configuration) == expected


def test_a_withdrawn_folder_goes_only_after_the_retention_and_never_while_the_table_reads_it():
    week = 7 * 86_400_000
    marked = {"_aeo_staging/p/batch-000000001-e1": 1_000, "_aeo_staging/p/batch-000000002-e3": 5_000,
              "_aeo_staging/p/batch-000000003-e1": 1_000}
    live = {"_aeo_staging/p/batch-000000003-e1"}  # read again (e.g. restored by hand): never deleted
    assert commits.expired_withdrawals(marked, live, 1_000 + week, week) == []  # not past the retention yet
    assert commits.expired_withdrawals(marked, live, 1_001 + week, week) == ["_aeo_staging/p/batch-000000001-e1"]
    assert commits.expired_withdrawals(marked, live, 5_001 + week, week) == [
        "_aeo_staging/p/batch-000000001-e1", "_aeo_staging/p/batch-000000002-e3"]
    assert commits.expired_withdrawals(marked, set(), 10**15, None) == []  # a retention the sink cannot read


def test_a_removed_file_names_its_attempt_folder_and_its_marker():
    path = "_aeo_staging/p.x/batch-000000012-e4/day=2024-05-01/part-0.parquet"
    assert commits.folder_of(path, "p.x", 12) == "_aeo_staging/p.x/batch-000000012-e4"
    assert commits.withdrawn_marker("p.x", "_aeo_staging/p.x/batch-000000012-e4") == \
        "_aeo_staging/p.x/_withdrawn/batch-000000012-e4.json"
    with pytest.raises(ValueError, match="not a staged file of batch 1"):
        commits.folder_of(path, "p.x", 1)


def test_a_marker_keeps_the_first_withdrawal_time_and_only_for_folders_that_exist(tmp_path):
    folders = WithdrawnFolders(DeltaTarget(spec(path=str(tmp_path))), "p")
    kept = "_aeo_staging/p/batch-000000001-e1"
    (tmp_path / kept).mkdir(parents=True)
    (tmp_path / kept / "part-0.parquet").write_bytes(b"PAR1")
    folders.mark([kept, "_aeo_staging/p/batch-000000002-e1"], at_ms=100)
    folders.mark([kept], at_ms=900)  # a retried retraction marks again: the earlier time stays
    assert folders.marked() == {kept: 100}
    assert sorted(p.name for p in (tmp_path / "_aeo_staging/p/_withdrawn").iterdir()) == ["batch-000000001-e1.json"]


def test_stats_come_from_the_footer_with_safe_bounds(tmp_path):
    path = tmp_path / "f.parquet"
    moment = datetime.datetime(2024, 5, 1, 12, 0, 0, 1500, tzinfo=datetime.timezone.utc)
    table = pa.table({
        "id": pa.array([3, None, 9], pa.int64()),
        "name": ["b", "a", None],
        "long": ["x" * 100, "y", "z"],
        "at": pa.array([moment, moment, None], pa.timestamp("us", tz="UTC")),
        "day": pa.array([datetime.date(2024, 5, 2), datetime.date(2024, 5, 1), None]),
        "score": pa.array([1.5, float("nan"), 0.5]),
        "nested": pa.array([{"a": 1}, {"a": 2}, None]),
    })
    pq.write_table(table, path, row_group_size=2)
    stats = json.loads(file_stats(pq.read_metadata(path)))
    assert stats["numRecords"] == 3
    assert stats["minValues"]["id"] == 3 and stats["maxValues"]["id"] == 9 and stats["nullCount"]["id"] == 1
    assert (stats["minValues"]["name"], stats["maxValues"]["name"], stats["nullCount"]["name"]) == ("a", "b", 1)
    assert "long" not in stats["minValues"] and stats["nullCount"]["long"] == 0  # too long for a bound
    assert stats["minValues"]["at"] == "2024-05-01T12:00:00.001Z"  # rounded down to the millisecond...
    assert stats["maxValues"]["at"] == "2024-05-01T12:00:00.002Z"  # ...and up, so no row falls outside
    assert (stats["minValues"]["day"], stats["maxValues"]["day"]) == ("2024-05-01", "2024-05-02")
    assert "nested" not in stats["nullCount"] and "nested.a" not in stats["nullCount"]


@pytest.mark.parametrize("pyspark, package", [
    ("3.5.7", "io.delta:delta-spark_2.12:3.3.2"),
    ("4.0.0", "io.delta:delta-spark_2.13:4.0.1"),
    ("4.2.0", "io.delta:delta-spark_2.13:4.4.0"),
])
def test_each_supported_pyspark_line_has_its_delta_release(pyspark, package):
    assert runtime.delta_spark_package(pyspark) == package
    assert runtime.reader_conf(pyspark)["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


def test_a_line_without_a_known_delta_release_is_named():
    with pytest.raises(ConfigurationError, match=r"for Spark 4\.1 \(pyspark 4\.1\.1\).*spark\.jars\.packages"):
        runtime.delta_spark_package("4.1.1")
