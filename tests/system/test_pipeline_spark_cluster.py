"""End to end on a real Spark standalone cluster: Airflow spark-submits the write, executors do it.

Real Kafka broker, real Airflow (scheduler + LocalExecutor), and a Spark master and worker
started by the project's devenv code on 127.0.0.1: executors are JVMs of their own with
their own Python workers, the driver is the spark-submit process of the write task.
Crashes are SIGKILLs of the real processes (an executor, spark-submit, the Airflow task)
while the executors are inside the write (a UDF holds them there until the test lets go).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from airflow_exactly_once.core.states import BatchState
from devtools.spark_cluster import LocalSparkCluster
from tests.conftest import SPARK_EXAMPLE_TOPIC
from tests.dags.eo_cluster_transforms import HOLD, started_attempt
from tests.dags.exactly_once_cluster_test_dag import SPARK_CONN_ID
from tests.harness import airflow_ledger
from tests.helpers import (assert_exactly_once, assert_ranges_tile, create_topic, produce, read_parquet,
                           staging_leftovers, values_of, wait_for)

HELD_DAG = "eo_cluster_test_held"
SUBMIT_MAIN_CLASS = "org.apache.spark.deploy.SparkSubmit"


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    cluster = LocalSparkCluster(tmp_path_factory.mktemp("spark-cluster"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def cluster_airflow(airflow, spark_cluster):
    """The session's Airflow, with `spark` connections to this module's cluster."""
    for conn_id in ("spark_default", SPARK_CONN_ID):
        airflow.put_connection(conn_id, spark_cluster.connection("client"))
    return airflow





def spark_submit_of(pipeline_id: str) -> psutil.Process | None:
    """The spark-submit JVM (client mode: the driver) writing a batch of `pipeline_id`."""
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if SUBMIT_MAIN_CLASS in cmdline and any(arg.startswith(f"exactly-once {pipeline_id}:") for arg in cmdline):
            return process
    return None


def start_held_run(kafka, airflow, faults: Path, output: Path, name: str, records: int) -> list[str]:
    """Trigger a run of the held DAG and return (the values sent) once executors are inside the write."""
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, records)
    (faults / HOLD).touch()
    airflow.wait_for_dag(HELD_DAG)
    airflow.trigger(HELD_DAG, f"{name}-1", {"pipeline_id": name, "topic": name, "output": str(output),
                                            "max_records": 1000})
    wait_for(lambda: started_attempt(faults), "an executor task to reach the transform")
    return sent


def test_example_dag_on_the_cluster(kafka, cluster_airflow, spark_cluster, example_spark_output):
    """dags/kafka_to_parquet_on_spark.py: one batch, read and written by executor JVMs."""
    create_topic(kafka.bootstrap_servers, SPARK_EXAMPLE_TOPIC, partitions=3)
    produce(kafka.bootstrap_servers, SPARK_EXAMPLE_TOPIC, 450, json_values=True)
    cluster_airflow.wait_for_dag("kafka_to_parquet_on_spark")
    assert cluster_airflow.run("kafka_to_parquet_on_spark", "cluster_1") == "success"

    rows = read_parquet(example_spark_output)
    assert_exactly_once([str(i) for i in range(450)], [str(r["id"]) for r in rows])
    [batch] = airflow_ledger(cluster_airflow).list_batches("kafka_to_parquet_on_spark")
    assert batch.state is BatchState.COMMITTED and batch.input_records == batch.output_records == 450
    [app] = spark_cluster.applications(f"exactly-once {batch.id}")
    assert app["state"] == "FINISHED"
    assert len(spark_cluster.executor_dirs(app["id"])) == 2  # two executor JVMs did the work
    log = cluster_airflow.task_log("kafka_to_parquet_on_spark", "cluster_1", "write")
    assert "airflow_exactly_once_job.zip" in log and "example_transforms" in log  # shipped with --py-files


def test_killed_task_driver_and_executor_never_change_the_range(kafka, cluster_airflow, spark_cluster, faults,
                                                                tmp_path, unique):
    """One run, three write attempts, each hit while its executors are inside the write:
    1. the Airflow task is SIGKILLed, and its spark-submit dies with it;
    2. the spark-submit JVM (the driver) is SIGKILLed;
    3. an executor is SIGKILLed: Spark reruns its tasks elsewhere and the attempt succeeds.
    The batch keeps its planned range throughout and is written once."""
    name = f"cluster-kills-{unique}"
    output = tmp_path / name
    sent = start_held_run(kafka, cluster_airflow, faults, output, name, 240)
    ledger = airflow_ledger(cluster_airflow)
    [planned] = ledger.list_batches(name)  # already claimed by attempt 1

    first_app = wait_for(lambda: started_attempt(faults), "attempt 1's executors to reach the transform")
    first = wait_for(lambda: spark_submit_of(name), "the spark-submit of attempt 1")
    first.parent().send_signal(signal.SIGKILL)  # the Airflow task process that ran spark-submit
    wait_for(lambda: not first.is_running(), "spark-submit to die with its task", 60)

    second_app = wait_for(lambda: started_attempt(faults, {first_app}), "attempt 2's executors to reach the transform")
    second = spark_submit_of(name)
    assert second is not None and second.pid != first.pid
    second.send_signal(signal.SIGKILL)

    third_app = wait_for(lambda: started_attempt(faults, {first_app, second_app}),
                         "attempt 3's executors to reach the transform")
    third = spark_submit_of(name)
    assert third_app in {app["id"] for app in spark_cluster.applications(f"exactly-once {planned.id}",
                                                                         active_only=True)}
    victim = spark_cluster.executor_pids(third_app)[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: victim not in spark_cluster.executor_pids(third_app), "the executor to die", 30)
    (faults / HOLD).unlink()

    assert cluster_airflow.wait_run(HELD_DAG, f"{name}-1") == "success"
    assert cluster_airflow.task_states(HELD_DAG, f"{name}-1")["write"] == ("success", 3)
    assert third.pid not in (first.pid, second.pid)
    assert "Lost executor" in cluster_airflow.task_log(HELD_DAG, f"{name}-1", "write")  # attempt 3 rode it out
    [batch] = ledger.list_batches(name)
    assert batch.seq == planned.seq and batch.ranges == planned.ranges  # the same range, never a newer one
    assert batch.state is BatchState.COMMITTED and batch.epoch == planned.epoch + 2  # claimed by attempts 2, 3
    assert batch.input_records == batch.output_records == 240
    assert_exactly_once(sent, values_of(output))
    assert staging_leftovers(output) == []
    assert_ranges_tile(ledger, name)
    apps = spark_cluster.applications(f"exactly-once {batch.id}")
    assert len(apps) == 3 and not any(spark_cluster.executor_pids(a["id"]) for a in apps)
