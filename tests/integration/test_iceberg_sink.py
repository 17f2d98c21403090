"""The Iceberg sink on real Iceberg tables: Spark's Iceberg runtime stages, pyiceberg publishes.

Both catalogs: the embedded one (a SQLite file under the warehouse) and the production one (a
JDBC catalog on the tests' real PostgreSQL). Output is read back with Spark SQL and with
pyiceberg and compared with the input exactly; every test ends with no staged snapshot and no
ref but main left in the table.
"""

from __future__ import annotations

import uuid

import pytest

from airflow_exactly_once.core.errors import ConfigurationError, FencedError, SinkError, TransactionLostError
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks import create_committer
from airflow_exactly_once.sinks.iceberg.table_committer import TableCommitter
from airflow_exactly_once.spark.write_job import run_write
from tests.conftest import PG_DATABASE
from tests.harness import FakeSource, Pipe, open_ledger, pipeline_config
from tests.helpers import assert_exactly_once, assert_ranges_tile, create_topic, iceberg_staged, produce


def as_text(frame):
    """The transform of these tests: Kafka's bytes as text, plus where each record came from."""
    from pyspark.sql import functions as F

    return frame.select(F.col("key").cast("string").alias("key"), F.col("value").cast("string").alias("value"),
                        F.col("partition"), F.col("offset"))


def catalog_spec(kind: str, request) -> dict:
    name = f"c{uuid.uuid4().hex[:8]}"  # one Spark session serves every test: a catalog name per test
    if kind == "embedded":
        return {"name": name}
    return {"type": "postgres", "name": name, "url": request.getfixturevalue("postgres").dsn(PG_DATABASE)}


@pytest.fixture(params=["embedded", "postgres"])
def catalog(request) -> dict:
    return catalog_spec(request.param, request)


def iceberg_spec(tmp_path, catalog: dict, **extra) -> dict:
    return {"type": "iceberg", "table": f"db.t_{uuid.uuid4().hex[:8]}", "warehouse": str(tmp_path / "lake"),
            "catalog": catalog, "create_table": True, **extra}


def read_pyiceberg(committer: TableCommitter, column: str = "value") -> list:
    return sorted(committer.load().scan().to_arrow().column(column).to_pylist())


def read_spark(spark, sink, column: str = "value") -> list:
    return sorted(r[0] for r in spark.sql(f"SELECT {column} FROM {sink.spark_table}").collect())


def assert_nothing_staged(committer: TableCommitter) -> None:
    """No staged snapshot outside main's history, no branch or tag but main."""
    assert iceberg_staged(committer) == []


def test_kafka_to_iceberg_exactly_once(spark, kafka, catalog, tmp_path, unique):
    """Real Kafka, real Spark, a real table: two batches, a reader during PREPARED, a second commit."""
    topic = f"ice-{unique}"
    create_topic(kafka.bootstrap_servers, topic, partitions=3)
    sent = produce(kafka.bootstrap_servers, topic, 60)
    config = pipeline_config(f"ice-{unique}", [topic], iceberg_spec(tmp_path, catalog), kafka.bootstrap_servers,
                             max_records_per_partition=10, transform="tests.integration.test_iceberg_sink:as_text")
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)))
    for run in ("run-1", "run-2"):
        batch = pipe.plan(run).batch
        summary = run_write(spark, pipe.new_coordinator(), batch.id)
        assert summary["action"] == "prepared" and summary["output_records"] == 30
        staged = pipe.sink.committable(pipe.ledger.get_batch(batch.id).handles)
        assert staged.snapshot_id is not None
        before = len(read_pyiceberg(pipe.sink.target.table_committer)) if pipe.sink.target.table_committer.load().current_snapshot() else 0
        assert before == (0 if run == "run-1" else 30)  # a reader of main sees nothing of the PREPARED batch
        assert len(read_spark(spark, pipe.sink.target)) == before
        assert "published" in pipe.commit(batch.id)
        assert "already" in pipe.new_coordinator().commit(batch.id)
        assert pipe.plan(run).action == "already-committed"  # a cleared, committed run: a recorded no-op
    assert pipe.plan("run-3").action == "empty"
    assert_exactly_once(sent, read_pyiceberg(pipe.sink.target.table_committer))
    assert_exactly_once(sent, read_spark(spark, pipe.sink.target))
    assert_ranges_tile(pipe.ledger, config.pipeline_id)
    history = pipe.sink.target.table_committer.main_history(pipe.sink.target.table_committer.load())
    assert [s.summary["aeo.batch"] for s in history] == [f"{config.pipeline_id}:2", f"{config.pipeline_id}:1"]
    assert_nothing_staged(pipe.sink.target.table_committer)


class Pipeline(Pipe):
    """The harness with the Iceberg sink and DataFrames made by Spark (no Kafka)."""

    def __init__(self, tmp_path, spec: dict, **config) -> None:
        cfg = pipeline_config(f"ice-{uuid.uuid4().hex[:8]}", ["t"], spec, **config)
        super().__init__(cfg, open_ledger(tmp_path / f"ledger-{cfg.pipeline_id}.db"),
                         lambda: FakeSource({("t", 0): 1000}))
        self.offset = 0

    def planted(self, n: int):
        batch = self.planted_batch(f"run-{self.offset}", [OffsetRange("t", 0, self.offset, self.offset + n)])
        self.offset += n
        return batch


def frame(spark, start: int, n: int):
    values = [f"v-{i}" for i in range(start, start + n)]
    return spark.createDataFrame([(str(i), v) for i, v in enumerate(values)], "key STRING, value STRING"), values


def test_a_prepared_batch_is_recovered_by_the_next_plan(spark, catalog, tmp_path):
    pipe = Pipeline(tmp_path, iceberg_spec(tmp_path, catalog), max_records_per_partition=10)
    first = pipe.plan("run-1").batch
    df, values = frame(spark, 0, 10)
    pipe.write(first.id, df)  # notify_complete never ran (the worker died)
    assert pipe.state(first.id) is BatchState.PREPARED
    pipe.coordinator = pipe.new_coordinator()  # the next run's process
    outcome = pipe.plan("run-2")  # recovery first: the PREPARED batch is committed before planning
    assert pipe.state(first.id) is BatchState.COMMITTED and outcome.batch.seq == first.seq + 1
    assert read_pyiceberg(pipe.sink.target.table_committer) == sorted(values)
    assert_nothing_staged(pipe.sink.target.table_committer)


def test_a_crash_between_publish_and_ledger_never_duplicates(spark, catalog, tmp_path):
    """notify_complete published, then died before the ledger: the retry recognises the batch in main's history."""
    pipe = Pipeline(tmp_path, iceberg_spec(tmp_path, catalog))
    prepared = pipe.write(pipe.planted(10).id, frame(spark, 0, 10)[0])
    pipe.sink.commit(prepared, pipe.sink.committable(prepared.handles))  # the sink commit, no ledger
    assert pipe.state(prepared.id) is BatchState.PREPARED
    assert "already published" in pipe.new_coordinator().commit(prepared.id)
    assert len(read_pyiceberg(pipe.sink.target.table_committer)) == 10
    pipe.commit(prepared.id)  # a cleared, committed run: a recorded no-op
    assert len(read_pyiceberg(pipe.sink.target.table_committer)) == 10


def test_overlapping_runs_commit_once(spark, catalog, tmp_path):
    """A zombie attempt staged a snapshot, a retry claimed the batch: only the retry's snapshot reaches main."""
    pipe = Pipeline(tmp_path, iceberg_spec(tmp_path, catalog))
    planned = pipe.planted(10)
    zombie = pipe.claim(planned.id)
    zombie_output = pipe.stage(frame(spark, 100, 10)[0], zombie)
    retry = pipe.claim(planned.id)
    df, values = frame(spark, 0, 10)
    retry_output = pipe.stage(df, retry)
    with pytest.raises(FencedError):
        pipe.coordinator.prepare(zombie, zombie_output, 10, 10)
    late_zombie = pipe.stage(frame(spark, 200, 10)[0], zombie)  # still running after being fenced
    pipe.coordinator.prepare(retry, retry_output, 10, 10)
    pipe.commit(planned.id)
    assert read_pyiceberg(pipe.sink.target.table_committer) == sorted(values)
    assert late_zombie.snapshot_id not in {s.snapshot_id for s in pipe.sink.target.table_committer.main_history(
        pipe.sink.target.table_committer.load())}
    assert_nothing_staged(pipe.sink.target.table_committer)  # the commit dropped the late zombie's snapshot too


def test_a_run_that_took_the_pipeline_over_is_the_only_one_to_commit(spark, catalog, tmp_path):
    """Manual trigger + schedule: the later plan supersedes the earlier PLANNED batch, whose write is fenced."""
    pipe = Pipeline(tmp_path, iceberg_spec(tmp_path, catalog), max_records_per_partition=10)
    earlier = pipe.plan("manual").batch
    later = pipe.plan("scheduled").batch
    assert pipe.state(earlier.id) is BatchState.ABORTED and later.ranges == earlier.ranges
    with pytest.raises(FencedError):
        pipe.write(earlier.id, frame(spark, 100, 10)[0])
    df, values = frame(spark, 0, 10)
    pipe.commit(pipe.write(later.id, df).id)
    assert read_pyiceberg(pipe.sink.target.table_committer) == sorted(values)
    assert_nothing_staged(pipe.sink.target.table_committer)


def test_parallel_batches_publish_in_any_order(spark, catalog, tmp_path):
    """Batches staged from the same main publish out of order: the later one fast-forwards, the other is
    cherry-picked onto the moved main."""
    pipe = Pipeline(tmp_path, iceberg_spec(tmp_path, catalog))
    (a, va), (b, vb) = frame(spark, 0, 10), frame(spark, 10, 10)
    first, second = pipe.write(pipe.planted(10).id, a), pipe.write(pipe.planted(10).id, b)
    assert "fast-forward" in pipe.commit(second.id)
    assert "cherry-pick" in pipe.commit(first.id)
    assert "already" in pipe.sink.commit(first, pipe.sink.committable(first.handles))
    assert read_pyiceberg(pipe.sink.target.table_committer) == sorted(va + vb)
    assert_nothing_staged(pipe.sink.target.table_committer)


def test_interval_replacement_swaps_a_batch_in_one_snapshot(spark, tmp_path, request):
    pipe = Pipeline(tmp_path, iceberg_spec(tmp_path, catalog_spec("embedded", request)))
    old = pipe.write(pipe.planted(10).id, frame(spark, 0, 10)[0])
    pipe.commit(old.id)
    new = pipe.write(pipe.planted(10).id, frame(spark, 50, 10)[0])
    staged = pipe.sink.committable(new.handles)
    old = pipe.ledger.get_batch(old.id)
    outcome = pipe.sink.commit_replacing(new, staged, old)
    assert "replacing batch" in outcome
    assert read_pyiceberg(pipe.sink.target.table_committer) == sorted(frame(spark, 50, 10)[1])
    assert "already" in pipe.sink.commit_replacing(new, staged, old)
    assert "withdrew" in pipe.sink.retract(new, staged) and "nothing" in pipe.sink.retract(new, staged)
    assert read_pyiceberg(pipe.sink.target.table_committer) == []
    assert_nothing_staged(pipe.sink.target.table_committer)


# -- bad input ------------------------------------------------------------------------

def test_a_schema_that_does_not_match_the_table_fails_the_write_clearly(spark, tmp_path, request):
    pipe = Pipeline(tmp_path, iceberg_spec(tmp_path, catalog_spec("embedded", request)))
    pipe.commit(pipe.write(pipe.planted(5).id, frame(spark, 0, 5)[0]).id)  # creates the table (key, value)
    planned = pipe.planted(5)
    wrong = spark.createDataFrame([("1", "x", 3)], "key STRING, value STRING, amount INT")
    with pytest.raises(ConfigurationError, match=r"columns \['amount'\] are not in the table.*ADD COLUMN"):
        pipe.write(planned.id, wrong)
    assert pipe.state(planned.id) is BatchState.PLANNED  # the write task fails; abort releases the range
    pipe.abort(planned.id)
    assert pipe.state(planned.id) is BatchState.ABORTED
    mistyped = spark.createDataFrame([("1", [1, 2])], "key STRING, value ARRAY<INT>")
    with pytest.raises(ConfigurationError, match="rejects the transform's output"):
        pipe.write(pipe.planted(5).id, mistyped)
    assert len(read_pyiceberg(pipe.sink.target.table_committer)) == 5
    assert_nothing_staged(pipe.sink.target.table_committer)


def test_a_missing_table_is_a_plan_time_error_unless_created(tmp_path, request):
    spec = iceberg_spec(tmp_path, catalog_spec("embedded", request), create_table=False)
    with pytest.raises(ConfigurationError, match="does not exist.*'create_table': True"):
        create_committer(spec).check("p")
    create_committer({**spec, "create_table": True}).check("p")  # created by the first write


def test_an_unreachable_catalog_is_a_retriable_error_naming_the_fix(tmp_path):
    from devtools.ports import reserve_port

    port = reserve_port()  # nothing listens there
    spec = iceberg_spec(tmp_path, {"type": "postgres", "url": f"postgresql://postgres@127.0.0.1:{port}/none"})
    config = pipeline_config(f"ice-{uuid.uuid4().hex[:8]}", ["t"], spec)
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: FakeSource({("t", 0): 10}))
    with pytest.raises(SinkError, match=f"(?s)cannot reach the Iceberg catalog.*127.0.0.1:{port}.*conn_id/url") as err:
        pipe.plan("run-1")
    assert err.value.retriable
    assert pipe.ledger.list_batches(config.pipeline_id, list(BatchState)) == []  # nothing planned


def test_a_table_dropped_before_notify_complete_sends_the_range_back(spark, catalog, tmp_path):
    pipe = Pipeline(tmp_path, iceberg_spec(tmp_path, catalog))
    prepared = pipe.write(pipe.planted(10).id, frame(spark, 0, 10)[0])
    pipe.sink.target.table_committer.catalog().drop_table(pipe.sink.target.table)  # an operator dropped it
    with pytest.raises(TransactionLostError, match="dropped after batch .* Recreate the table"):
        pipe.commit(prepared.id)
    assert pipe.state(prepared.id) is BatchState.ABORTED  # the range goes to the next run: nothing lost
    again = pipe.planted_batch("run-again", list(prepared.ranges))
    df, values = frame(spark, 0, 10)
    pipe.commit(pipe.write(again.id, df).id)  # create_table: the next write recreates it
    assert read_pyiceberg(pipe.sink.target.table_committer) == sorted(values)
    assert_nothing_staged(pipe.sink.target.table_committer)
