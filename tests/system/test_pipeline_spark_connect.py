"""End to end with the write on a real Spark Connect server: Airflow runs the tasks, a warm Spark runs the job.

The session's server (devtools.spark_connect) runs in local mode; the write task's process is
only a client. Crashes: the write task SIGKILLed while the server runs its job (the retry
interrupts the dead attempt's operations through its session), and the server killed and
restarted while a batch is PREPARED.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import psutil
import pytest

from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.spark.connect_server.session import TAG_DETAIL
from tests.dags.eo_cluster_transforms import HOLD, STARTED, started_attempt
from tests.harness import airflow_ledger
from tests.helpers import (assert_exactly_once, assert_ranges_tile, create_topic, produce, staging_leftovers, values_of,
                           wait_for)


@pytest.fixture(scope="module")
def connect_airflow(airflow, warm_spark):
    """The session's Airflow with a `spark_connect` connection to the session's server."""
    return airflow


def clients_of(server) -> list[psutil.Process]:
    """Processes with a connection to the Spark Connect server: the write tasks running on it."""
    pids = {c.pid for c in psutil.net_connections("tcp")
            if c.raddr and c.raddr.port == server.port and c.status == psutil.CONN_ESTABLISHED and c.pid}
    return [psutil.Process(pid) for pid in pids if pid != server.process.pid]


def conf_for(name: str, output: Path, max_records: int = 1000) -> dict:
    return {"pipeline_id": name, "topic": name, "output": str(output), "max_records": max_records}


def test_write_task_killed_mid_write_is_retried_and_interrupts_the_dead_attempt(kafka, connect_airflow, spark_connect,
                                                                                faults, tmp_path, unique):
    name = f"connect-kill-{unique}"
    output = tmp_path / name
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 150)
    (faults / HOLD).touch()  # the server's Python workers wait inside the write while this exists
    connect_airflow.wait_for_dag("eo_connect_test_held")
    connect_airflow.trigger("eo_connect_test_held", f"{name}-1", conf_for(name, output))
    first_attempt = wait_for(lambda: started_attempt(faults), "the server's workers to reach the transform")
    ledger = airflow_ledger(connect_airflow)
    [claimed] = ledger.list_batches(name)
    first_attempt_tag = claimed.details[TAG_DETAIL]
    [task] = wait_for(lambda: clients_of(spark_connect), "the write task's connection to the server")
    task.send_signal(signal.SIGKILL)  # the job keeps running on the server, held in the transform

    wait_for(lambda: started_attempt(faults, {first_attempt}), "the retry's workers to reach the transform")
    (faults / HOLD).unlink()
    assert connect_airflow.wait_run("eo_connect_test_held", f"{name}-1") == "success"
    assert connect_airflow.task_states("eo_connect_test_held", f"{name}-1")["write"] == ("success", 2)
    log = connect_airflow.task_log("eo_connect_test_held", f"{name}-1", "write")
    assert "operation(s) an earlier attempt of batch" in log  # the retry interrupted the orphaned job
    [batch] = ledger.list_batches(name)
    assert batch.seq == claimed.seq and batch.ranges == claimed.ranges and batch.epoch == claimed.epoch + 1
    assert batch.details[TAG_DETAIL] != first_attempt_tag  # the retry's own operations, in the pipeline's session
    assert batch.state is BatchState.COMMITTED and batch.output_records == 150
    assert_exactly_once(sent, values_of(output))
    assert staging_leftovers(output) == []
    assert_ranges_tile(ledger, name)


def test_server_restarted_while_a_batch_is_prepared(kafka, connect_airflow, spark_connect, faults, tmp_path, unique):
    name = f"connect-restart-{unique}"
    output = tmp_path / name
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 240)  # two batches of 3 x 40
    connect_airflow.wait_for_dag("eo_connect_test")
    arm(faults, "notify.before_sink_commit", "raise", 1)  # run 1's batch stays PREPARED until the retry
    connect_airflow.trigger("eo_connect_test", f"{name}-1", conf_for(name, output, 40))
    ledger = airflow_ledger(connect_airflow)
    wait_for(lambda: connect_airflow.task_states("eo_connect_test", f"{name}-1").get("notify_complete", (None,))[0]
             == "up_for_retry", "notify_complete to fail once")
    [prepared] = ledger.list_batches(name)
    assert prepared.state is BatchState.PREPARED
    spark_connect.kill()  # the server, its sessions and whatever it had in memory are gone
    spark_connect.start()
    assert connect_airflow.wait_run("eo_connect_test", f"{name}-1") == "success"
    assert connect_airflow.run("eo_connect_test", f"{name}-2", conf_for(name, output, 40)) == "success"
    committed = ledger.list_batches(name, [BatchState.COMMITTED], newest_first=False)
    assert [b.output_records for b in committed] == [120, 120]
    assert_exactly_once(sent, values_of(output))
    assert_ranges_tile(ledger, name)


def test_a_write_timed_out_or_marked_failed_leaves_no_job_on_the_server(kafka, connect_airflow, spark_connect, faults,
                                                                       tmp_path, unique):
    """Both ways Airflow ends a running write. execution_timeout: the timeout ends the write's wait, which interrupts
    its tagged operations in the pipeline's session. The run marked failed (the UI, the API): the write's supervisor
    sends SIGTERM and the write operator's on_kill interrupts the attempt's operations. Either way the job, held in
    the transform for up to two minutes otherwise, is gone before the abort or the next run's recovery looks (they
    stop 0 operations), and the next run writes the same range exactly once."""
    name = f"connect-ended-{unique}"
    output = tmp_path / name
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 90)
    (faults / HOLD).touch()  # held until the timeout
    connect_airflow.wait_for_dag("eo_connect_test_timeout")
    assert connect_airflow.run("eo_connect_test_timeout", f"{name}-1", conf_for(name, output)) == "failed"
    states = connect_airflow.task_states("eo_connect_test_timeout", f"{name}-1")
    assert states["write"] == ("failed", 1) and states["abort"][0] == "success", states
    assert "Timeout" in connect_airflow.task_log("eo_connect_test_timeout", f"{name}-1", "write")
    abort_log = connect_airflow.task_log("eo_connect_test_timeout", f"{name}-1", "abort")
    assert "stopped 0 operation(s) of the last write attempt" in abort_log, abort_log[-3000:]

    (faults / STARTED).unlink(missing_ok=True)  # run 1's job is gone (above): only run 2's workers write it now
    connect_airflow.wait_for_dag("eo_connect_test_held")
    run_id = f"{name}-2"
    connect_airflow.trigger("eo_connect_test_held", run_id, conf_for(name, output))
    attempt = wait_for(lambda: started_attempt(faults), "the write's workers to reach the transform")
    # The run marked failed: no abort task runs, the write's supervisor terminates it (SIGTERM -> on_kill).
    connect_airflow.api("PATCH", f"/dags/eo_connect_test_held/dagRuns/{run_id}", {"state": "failed"})
    assert connect_airflow.wait_run("eo_connect_test_held", run_id) == "failed"
    interrupted = re.compile(r"interrupted 1 Spark Connect operation\(s\) of this write attempt")  # its job
    try:
        write_log = wait_for(lambda: (log := connect_airflow.task_log("eo_connect_test_held", run_id, "write"))
                             and interrupted.search(log) and log, "the write's on_kill to interrupt its job", 120)
    except AssertionError as missing:
        raise AssertionError(f"{missing}; the write's log:\n"
                             f"{connect_airflow.task_log('eo_connect_test_held', run_id, 'write')[-4000:]}") from None
    assert "fenced:" not in write_log, write_log[-3000:]  # on_kill did it, not the fence watch
    assert started_attempt(faults) == attempt  # no retry reached the transform

    (faults / HOLD).unlink()
    connect_airflow.wait_for_dag("eo_connect_test")
    assert connect_airflow.run("eo_connect_test", f"{name}-3", conf_for(name, output)) == "success"
    ledger = airflow_ledger(connect_airflow)
    batches = ledger.list_batches(name, newest_first=False)
    assert [b.state for b in batches] == [BatchState.ABORTED, BatchState.ABORTED, BatchState.COMMITTED], batches
    run_3_plan = connect_airflow.task_log("eo_connect_test", f"{name}-3", "plan")
    assert "stopped 0 operation(s)" in run_3_plan, run_3_plan[-3000:]  # the recovery found nothing left running
    assert staging_leftovers(output) == []
    assert_exactly_once(sent, values_of(output))
    assert_ranges_tile(ledger, name)
