"""End to end, Airflow running the tasks: Kafka -> Spark -> Parquet, exactly once.

Real Kafka broker, real Spark (local mode, in the task process), real Airflow scheduler
with LocalExecutor. Crashes are SIGKILLs of the real task process at named protocol
steps; Airflow notices and retries, as it would for a dying worker.
"""

from __future__ import annotations

import time

import pytest

from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.states import BatchState
from tests.conftest import EXAMPLE_TOPIC
from tests.harness import airflow_ledger
from tests.helpers import (
    values_of,
    assert_exactly_once,
    assert_ranges_tile,
    create_topic,
    produce,
    read_parquet,
    staging_leftovers,
)

TEST_DAG = "eo_parquet_test"
# These batches of 300 are read by the write itself (local_read_max_records); at these points Spark's Kafka
# source reads them instead, so that both ways of reading a batch are killed mid-write.
SPARK_SOURCE_POINTS = ("write.before_stage", "write.after_prepare")




def pipeline_conf(kafka, tmp_path, name: str, **overrides) -> dict:
    conf = {"pipeline_id": name, "topic": name, "output": str(tmp_path / name), "max_records": 100}
    conf.update(overrides)
    return conf


def test_example_dag_three_batches_then_an_empty_run(kafka, airflow, example_output):
    create_topic(kafka.bootstrap_servers, EXAMPLE_TOPIC, partitions=3)
    sent = produce(kafka.bootstrap_servers, EXAMPLE_TOPIC, 1200, json_values=True)
    airflow.wait_for_dag("kafka_to_parquet")
    for n in range(3):  # 150 per partition and batch: 450 + 450 + 300
        assert airflow.run("kafka_to_parquet", f"happy_{n}") == "success"
        # No process of the run's tasks (the write's Spark JVM, its Python workers) outlives them.
        assert airflow.run_processes(f"happy_{n}") == []
    rows = read_parquet(example_output)
    assert_exactly_once([str(i) for i in range(1200)], [str(r["id"]) for r in rows])
    assert {r["name"] for r in rows} == {f"item-{i}" for i in range(1200)}
    assert len(sent) == 1200

    ledger = airflow_ledger(airflow)
    committed = ledger.list_batches("kafka_to_parquet", [BatchState.COMMITTED], newest_first=False)
    assert [b.input_records for b in committed] == [450, 450, 300]
    assert [b.output_records for b in committed] == [450, 450, 300]
    assert_ranges_tile(ledger, "kafka_to_parquet")
    assert sorted(p.name for p in (example_output / "_manifest").iterdir()) == [
        "batch-000000001.json", "batch-000000002.json", "batch-000000003.json"]

    # Nothing new: the run succeeds, the batch tasks are skipped, the ledger records an EMPTY batch.
    assert airflow.run("kafka_to_parquet", "happy_empty") == "success"
    states = airflow.task_states("kafka_to_parquet", "happy_empty")
    assert states["plan"][0] == "skipped" and states["write"][0] == "skipped"
    assert [b.state for b in ledger.list_batches("kafka_to_parquet")] == [BatchState.EMPTY] + [BatchState.COMMITTED] * 3


@pytest.mark.parametrize("point", [
    "plan.after_ledger",
    "write.before_stage",
    "write.after_stage",
    "write.after_prepare",
    "notify.after_sink_commit",
    "notify.after_ledger",
])
def test_worker_killed_at_protocol_step(kafka, airflow, faults, tmp_path, unique, point, warm_spark):
    name = f"crash-{point.replace('.', '-').replace('_', '-')}-{unique}"
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 700)  # batches of 3 x 100: 300 + 300 + 100
    airflow.wait_for_dag(TEST_DAG)
    conf = pipeline_conf(kafka, tmp_path, name, max_records=100, **warm_spark)
    if point in SPARK_SOURCE_POINTS:
        conf["local_read_max_records"] = 0
    arm(faults, point, "kill", times=1)
    assert airflow.run(TEST_DAG, f"{name}-1", conf) == "success"
    assert (faults / "fired.log").read_text().count(point) == 1, "the crash point was never reached"
    assert airflow.run(TEST_DAG, f"{name}-2", conf) == "success"
    output = tmp_path / name
    so_far = values_of(output)
    assert len(so_far) == len(set(so_far)) == 600  # two batches, no duplicates
    assert airflow.run(TEST_DAG, f"{name}-3", conf) == "success"
    assert_exactly_once(sent, values_of(output))
    assert staging_leftovers(output) == []
    assert_ranges_tile(airflow_ledger(airflow), name)


def test_spark_job_dies_mid_write(kafka, airflow, faults, tmp_path, unique):
    name = f"sparkdies-{unique}"
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 300)
    dag = f"{TEST_DAG}_kill_spark_once"
    airflow.wait_for_dag(dag)
    (faults / "kill-spark-jvm").write_text("armed")
    conf = pipeline_conf(kafka, tmp_path, name, max_records=1000)
    assert airflow.run(dag, f"{name}-1", conf) == "success"
    assert not (faults / "kill-spark-jvm").exists(), "the Spark JVM was never killed"
    states = airflow.task_states(dag, f"{name}-1")
    assert states["write"] == ("success", 2), states  # first attempt died with its JVM
    output = tmp_path / name
    assert_exactly_once(sent, values_of(output))
    assert staging_leftovers(output) == []


def test_spark_reader_never_sees_staged_output(kafka, airflow, faults, spark, tmp_path, unique, warm_spark):
    """A batch left PREPARED (notify_complete never ran) is invisible to Spark until committed."""
    name = f"staged-{unique}"
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 90)
    airflow.wait_for_dag(TEST_DAG)
    arm(faults, "notify.before_sink_commit", "raise", times=3)  # notify_complete fails for good
    conf = pipeline_conf(kafka, tmp_path, name, **warm_spark)
    assert airflow.run(TEST_DAG, f"{name}-1", conf) == "failed"
    ledger = airflow_ledger(airflow)
    [batch] = ledger.list_batches(name)
    assert batch.state is BatchState.PREPARED  # abort left the pre-committed output alone
    output = tmp_path / name
    assert len(staging_leftovers(output)) == 1

    try:
        assert spark.read.format("parquet").load(str(output)).count() == 0
    except Exception as exc:  # no visible file at all: Spark cannot even infer a schema
        assert "UNABLE_TO_INFER_SCHEMA" in str(exc) or "Unable to infer schema" in str(exc)
    # The next run recovers first: it commits the PREPARED batch, then plans nothing new.
    assert airflow.run(TEST_DAG, f"{name}-2", conf) == "success"
    assert ledger.get_batch(batch.id).state is BatchState.COMMITTED
    assert spark.read.parquet(str(output)).count() == 90
    assert_exactly_once(sent, values_of(output))


def test_clearing_a_committed_run_does_not_duplicate(kafka, airflow, tmp_path, unique, warm_spark):
    name = f"replay-{unique}"
    create_topic(kafka.bootstrap_servers, name)
    produce(kafka.bootstrap_servers, name, 150)
    airflow.wait_for_dag(TEST_DAG)
    conf = pipeline_conf(kafka, tmp_path, name, max_records=30, **warm_spark)
    assert airflow.run(TEST_DAG, f"{name}-1", conf) == "success"
    output = tmp_path / name
    first = values_of(output)
    assert len(first) == 90
    produce(kafka.bootstrap_servers, name, 60, start=150)  # newer data that a replay must not take

    airflow.clear(TEST_DAG, f"{name}-1")
    assert airflow.wait_run(TEST_DAG, f"{name}-1") == "success"
    assert sorted(values_of(output)) == sorted(first)
    ledger = airflow_ledger(airflow)
    assert len(ledger.list_batches(name)) == 1
    assert any(e["kind"] == "replay-noop" for e in ledger.list_events(name))
    assert "already committed" in airflow.task_log(TEST_DAG, f"{name}-1", "plan")


def test_overlapping_runs_are_fenced(kafka, airflow, tmp_path, unique, warm_spark):
    """Run B is triggered while run A writes the same range: only one of them commits it."""
    name = f"fence-{unique}"
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 120)
    dag = f"{TEST_DAG}_slow_rows"
    airflow.wait_for_dag(dag)
    conf = pipeline_conf(kafka, tmp_path, name, max_records=1000, **warm_spark)
    airflow.trigger(dag, f"{name}-a", conf)
    deadline = time.monotonic() + 300
    while airflow.task_states(dag, f"{name}-a").get("write", (None,))[0] != "running":
        assert time.monotonic() < deadline, "run A never started writing"
        time.sleep(0.5)
    ledger = airflow_ledger(airflow)

    def claimed_by_a():  # A's write has claimed its batch (a new epoch); its Spark job runs slowly
        batch = ledger.latest_batch_for_run(name, f"{name}-a")
        return batch is not None and batch.state is BatchState.PLANNED and batch.updated_at != batch.created_at

    while not claimed_by_a():
        assert time.monotonic() < deadline, "run A never claimed its batch"
        time.sleep(0.2)
    airflow.trigger(dag, f"{name}-b", conf)
    results = {run: airflow.wait_run(dag, f"{name}-{run}") for run in ("a", "b")}
    assert results == {"a": "failed", "b": "success"}, results
    batches = {b.run_id: b for b in ledger.list_batches(name)}
    assert batches[f"{name}-a"].state is BatchState.ABORTED
    assert "superseded" in (batches[f"{name}-a"].error or "")
    assert batches[f"{name}-b"].state is BatchState.COMMITTED
    assert batches[f"{name}-a"].ranges == batches[f"{name}-b"].ranges
    assert "FencedError" in airflow.task_log(dag, f"{name}-a", "write")
    output = tmp_path / name
    assert_exactly_once(sent, values_of(output))
    assert staging_leftovers(output) == []


@pytest.mark.parametrize("case, dag_suffix, overrides, expected", [
    ("unreachable", "", {"bootstrap_servers": "127.0.0.1:1"}, "no Kafka broker answered at '127.0.0.1:1'"),
    ("no-topic", "", {"topic": "this-topic-does-not-exist"}, "Kafka topic 'this-topic-does-not-exist' does not exist"),
    ("transform-raises", "_explode", {}, "bad transform: division by zero"),
    ("wrong-type", "_wrong_type", {}, "returned list, not a pyspark.sql.DataFrame"),
])
def test_bad_input_fails_clearly_and_changes_nothing(kafka, airflow, tmp_path, unique, case, dag_suffix, overrides,
                                                     expected):
    name = f"bad-{case}-{unique}"
    create_topic(kafka.bootstrap_servers, name)
    produce(kafka.bootstrap_servers, name, 30)
    dag = TEST_DAG + dag_suffix
    airflow.wait_for_dag(dag)
    conf = pipeline_conf(kafka, tmp_path, name, **overrides)
    assert airflow.run(dag, f"{name}-1", conf) == "failed"
    failed_step = "plan" if case in ("unreachable", "no-topic") else "write"
    assert expected in airflow.task_log(dag, f"{name}-1", failed_step)
    ledger = airflow_ledger(airflow)
    assert ledger.list_batches(name, [BatchState.COMMITTED, BatchState.PREPARED, BatchState.PLANNED]) == []
    assert values_of(tmp_path / name) == []
    assert staging_leftovers(tmp_path / name) == []


def test_broker_crash_between_write_and_notify_complete(kafka, airflow, faults, tmp_path, unique, warm_spark):
    """Invariant 1 with a broker restart: a PREPARED batch and the next plan survive a SIGKILLed broker."""
    name = f"brokercrash-{unique}"
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 450)
    airflow.wait_for_dag(TEST_DAG)
    conf = pipeline_conf(kafka, tmp_path, name, max_records=100, **warm_spark)
    arm(faults, "notify.before_sink_commit", "raise", times=3)  # run 1 ends with its batch PREPARED
    assert airflow.run(TEST_DAG, f"{name}-1", conf) == "failed"
    kafka.kill()
    kafka.start()
    for n in (2, 3):  # recovery commits batch 1, then two more batches drain the topic
        assert airflow.run(TEST_DAG, f"{name}-{n}", conf) == "success"
    assert_exactly_once(sent, values_of(tmp_path / name))
    assert_ranges_tile(airflow_ledger(airflow), name)
    assert staging_leftovers(tmp_path / name) == []
