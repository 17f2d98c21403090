"""End to end, Airflow running the tasks: Kafka -> Spark -> Kafka, exactly once.

Real Kafka broker, real Spark (local mode, in the task process), real Airflow scheduler with
LocalExecutor. Crashes are SIGKILLs of the real task process at named protocol steps;
Airflow notices and retries, as it would for a dying worker. The output is read the way
consumers read it (read_committed), and under read_uncommitted to prove that the aborted
attempts really wrote to Kafka, i.e. that transactions, not luck, kept them out.
"""

from __future__ import annotations

import json

from airflow_exactly_once.observe.drift import mirror_metadata
from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.states import BatchState
from tests.conftest import AIRFLOW_DATABASE, K2K_INPUT, K2K_OUTPUT
from tests.harness import airflow_ledger, operator_cli
from tests.helpers import assert_exactly_once, assert_ranges_tile, create_topic, pg_query, produce
from tests.kafka_helpers import alter_group, delete_group_offset, group_offsets, read_all, settled_ends, wait_transactions_ended

TEST_DAG = "eo_kafka_test"



def new_pipeline(kafka, name: str, records: int, **params) -> tuple[dict, list[str]]:
    """Input and output topics for one test pipeline, `records` inputs, and the DAG run conf."""
    create_topic(kafka.bootstrap_servers, name, partitions=3)
    create_topic(kafka.bootstrap_servers, f"{name}-out", partitions=2)
    sent = produce(kafka.bootstrap_servers, name, records)
    conf = {"pipeline_id": name, "topic": name, "output_topic": f"{name}-out", "max_records": 1000, **params}
    return conf, [value.upper() for value in sent]  # what eo_kafka_transforms.upper_value makes of them


def test_example_dag_batches_are_exact_and_mirrored_to_the_consumer_group(kafka, airflow, airflow_database,
                                                                          warm_spark):
    # warm_spark: the example's write runs on the session's Spark Connect server (its environment says so)
    create_topic(kafka.bootstrap_servers, K2K_INPUT, partitions=3)
    create_topic(kafka.bootstrap_servers, K2K_OUTPUT, partitions=3)
    produce(kafka.bootstrap_servers, K2K_INPUT, 600, json_values=True)
    airflow.wait_for_dag("kafka_to_kafka")
    for n in range(2):  # 150 offsets per partition and batch: 450 + 150
        assert airflow.run("kafka_to_kafka", f"k2k_{n}") == "success"

    out = [json.loads(v) for v in read_all(kafka.bootstrap_servers, K2K_OUTPUT)]
    assert_exactly_once([str(i) for i in range(600)], [str(e["id"]) for e in out])
    assert {e["id"]: (e["name"], e["amount_cents"]) for e in out} == {
        i: (f"ITEM-{i}", i * 50) for i in range(600)}  # the transform, applied once to each record
    assert {e["source"].split(":")[0] for e in out} == {K2K_INPUT}
    ledger = airflow_ledger(airflow)
    committed = ledger.list_batches("kafka_to_kafka", [BatchState.COMMITTED], newest_first=False)
    assert [b.output_records for b in committed] == [450, 150]
    # One transaction per Spark partition: the batches are small, so the write read them itself and Spark
    # sliced the local relation by its parallelism (Spark's Kafka source would give one per Kafka partition).
    assert all(1 <= len(b.handles["writers"]) <= 3 for b in committed), [b.handles for b in committed]
    assert_ranges_tile(ledger, "kafka_to_kafka")
    # The lag dashboards' view: the group's offsets are the ledger's committed positions.
    assert group_offsets(kafka.bootstrap_servers, "kafka_to_kafka") == {(K2K_INPUT, p): 200 for p in range(3)}
    assert group_offsets(kafka.bootstrap_servers, "kafka_to_kafka") == ledger.committed_positions("kafka_to_kafka")
    check_drift_made_on_purpose_and_repaired(kafka, airflow, airflow_database.dsn(AIRFLOW_DATABASE), "kafka_to_kafka")


def check_drift_made_on_purpose_and_repaired(kafka, airflow, airflow_dsn: str, pipeline: str) -> None:
    """`airflow-exactly-once check` against the real group and Airflow's real Asset events: each kind of drift is
    found with its cause, and the repairs it names work. The DAG (the Kafka example) is named as its pipeline."""
    check = operator_cli(airflow, "check", pipeline)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "drift OK: compared with consumer group 'kafka_to_kafka'; 2 Asset event(s) of " in check.stdout
    # The group: partition 0 moved back by hand, partition 1 committed by a consumer with auto-commit, partition
    # 2's offset deleted.
    alter_group(kafka.bootstrap_servers, pipeline, {(K2K_INPUT, 0): (120, mirror_metadata(pipeline)),
                                                    (K2K_INPUT, 1): (230, "")})
    delete_group_offset(kafka.bootstrap_servers, pipeline, (K2K_INPUT, 2))
    # Airflow: batch 2's event gone (Airflow never recorded it: the state a notify_complete leaves that failed
    # after its commit and was marked success), and events posted by hand: for a batch the ledger never had,
    # with other offsets than batch 1's, and naming no batch.
    [(asset_id,)] = pg_query(airflow_dsn, "SELECT id FROM asset WHERE uri = %s", (f"x-exactly-once://{pipeline}",))
    deleted = len(pg_query(airflow_dsn, "DELETE FROM asset_event WHERE CAST(CAST(extra AS TEXT) AS JSON) ->> "
                                        "'batch_seq' = '2' AND asset_id = %s RETURNING id", (asset_id,)))
    assert deleted == 1
    posted = ({"batch_seq": 7, "ranges": []}, {"note": "by hand"},
              {"batch_seq": 1, "ranges": [{"topic": K2K_INPUT, "partition": 0, "start": 0, "end": 999}]})
    for extra in posted:
        airflow.api("POST", "/assets/events", {"asset_id": asset_id, "extra": extra})
    check = operator_cli(airflow, "--json", "check", pipeline)
    assert check.returncode == 1, check.stdout + check.stderr
    found = {(f["kind"], f["subject"]): f for f in json.loads(check.stdout)["findings"]}
    by_hand = [("event-for-uncommitted-batch", "batch 7"), ("event-ranges-differ", "batch 1"),
               ("event-without-batch", f"x-exactly-once://{pipeline}")]
    assert sorted(found) == sorted(by_hand + [
        ("event-missing", "batches 2"), ("group-ahead", f"{K2K_INPUT}[1]"), ("group-behind", f"{K2K_INPUT}[0]"),
        ("group-missing", f"{K2K_INPUT}[2]")])
    assert f"{K2K_INPUT}[0] 0..999" in found[("event-ranges-differ", "batch 1")]["detail"]
    assert "the ledger has no such batch (its newest is 2)" in found[("event-for-uncommitted-batch", "batch 7")][
        "detail"]
    assert "120, the ledger's position is 200 (80 offsets behind)" in found[("group-behind", f"{K2K_INPUT}[0]")][
        "detail"]
    assert "a consumer other than this pipeline commits" in found[("group-ahead", f"{K2K_INPUT}[1]")]["cause"]
    assert "clear notify_complete" in found[("event-missing", "batches 2")]["repair"]
    # The repairs the check names: mirror the ledger to the group; clear notify_complete of batch 2's run.
    mirrored = operator_cli(airflow, "mirror", pipeline, "--execute")
    assert mirrored.returncode == 0 and "mirrored 3 committed offsets" in mirrored.stdout, mirrored.stderr
    [notify] = [t for t in airflow.api("GET", f"/dags/{pipeline}/dagRuns/k2k_1/taskInstances")["task_instances"]
                if t["task_id"].endswith("notify_complete")]
    airflow.clear(pipeline, "k2k_1", task_ids=[notify["task_id"]])
    assert airflow.wait_run(pipeline, "k2k_1") == "success"
    check = operator_cli(airflow, "--json", "check", pipeline)
    # what was posted by hand stays in Airflow's history
    assert sorted((f["kind"], f["subject"]) for f in json.loads(check.stdout)["findings"]) == by_hand


def test_same_crash_duplicates_under_at_least_once_and_not_under_exactly_once(kafka, airflow, faults, unique,
                                                                               warm_spark):
    """The write task is SIGKILLed after its records reached Kafka, before the batch became PREPARED."""
    airflow.wait_for_dag(TEST_DAG)
    outputs = {}
    for guarantee in ("AT_LEAST_ONCE", "EXACTLY_ONCE"):
        name = f"k-crash-{guarantee.lower().replace('_', '-')}-{unique}"
        conf, expected = new_pipeline(kafka, name, 90, guarantee=guarantee, **warm_spark)
        arm(faults, "write.after_stage", "kill", times=1)
        assert airflow.run(TEST_DAG, f"{name}-1", conf) == "success"
        assert airflow.task_states(TEST_DAG, f"{name}-1")["write"] == ("success", 2)
        outputs[guarantee] = (expected, read_all(kafka.bootstrap_servers, conf["output_topic"]),
                              read_all(kafka.bootstrap_servers, conf["output_topic"], "read_uncommitted"))
    assert (faults / "fired.log").read_text().count("write.after_stage") == 2

    expected, visible, physical = outputs["AT_LEAST_ONCE"]
    assert sorted(visible) == sorted(expected * 2)  # the retry wrote every record a second time
    expected, visible, physical = outputs["EXACTLY_ONCE"]
    assert_exactly_once(expected, visible)
    assert sorted(physical) == sorted(expected * 2)  # the killed attempt's copy is in the log, aborted


def test_write_killed_after_prepare_then_notify_commits_twice(kafka, airflow, faults, unique, warm_spark):
    """write dies after PREPARED; notify_complete, in a fresh process, commits the stored transactions,
    dies right after the commit and commits them again on its retry."""
    name = f"k-resume-{unique}"
    conf, expected = new_pipeline(kafka, name, 120, **warm_spark)
    airflow.wait_for_dag(TEST_DAG)
    arm(faults, "write.after_prepare", "kill", times=1)
    arm(faults, "notify.after_sink_commit", "kill", times=1)
    assert airflow.run(TEST_DAG, f"{name}-1", conf) == "success"
    states = airflow.task_states(TEST_DAG, f"{name}-1")
    assert states["write"] == ("success", 2) and states["notify_complete"] == ("success", 2), states
    fired = (faults / "fired.log").read_text()
    assert "write.after_prepare" in fired and "notify.after_sink_commit" in fired
    # Attempt 1 committed the transactions and died before the ledger said so; attempt 2 found the
    # batch still PREPARED and committed the same transactions again, harmlessly.
    retry_log = (airflow.home / "logs" / f"dag_id={TEST_DAG}" / f"run_id={name}-1"
                 / "task_id=exactly_once.notify_complete" / "attempt=2.log").read_text()
    [batch] = airflow_ledger(airflow).list_batches(name)
    assert batch.state is BatchState.COMMITTED
    transactions = len(batch.handles["writers"])  # one per Spark partition of the write that lived
    assert transactions >= 1
    assert f"committed {transactions} Kafka transaction(s) of batch 1 (120 records)" in retry_log

    assert_exactly_once(expected, read_all(kafka.bootstrap_servers, conf["output_topic"]))
    # Nothing was rewritten: the records in the log are exactly the committed ones.
    assert sorted(read_all(kafka.bootstrap_servers, conf["output_topic"], "read_uncommitted")) == sorted(expected)


def test_transaction_timeout_aborts_the_batch_and_the_range_is_processed_again(kafka, airflow, faults, unique,
                                                                               warm_spark):
    name = f"k-timeout-{unique}"
    conf, expected = new_pipeline(kafka, name, 60, transaction_timeout_ms=6000, **warm_spark)
    airflow.wait_for_dag(TEST_DAG)
    arm(faults, "notify.before_sink_commit", "raise", times=3)  # notify_complete fails for good
    airflow.run(TEST_DAG, f"{name}-1", conf)
    assert airflow.task_states(TEST_DAG, f"{name}-1")["notify_complete"] == ("failed", 3)
    ledger = airflow_ledger(airflow)
    [first] = ledger.list_batches(name)
    assert first.state is BatchState.PREPARED  # abort leaves pre-committed output to the next run
    wait_transactions_ended(kafka.bootstrap_servers, first.handles)  # ...which comes after the timeout

    assert airflow.run(TEST_DAG, f"{name}-2", {**conf, "transaction_timeout_ms": 120_000}) == "success"
    first, second = ledger.list_batches(name, newest_first=False)
    assert first.state is BatchState.ABORTED and "aborted before notify_complete" in first.error
    assert second.state is BatchState.COMMITTED and second.ranges == first.ranges
    assert "is now ABORTED" in airflow.task_log(TEST_DAG, f"{name}-2", "plan")
    assert_exactly_once(expected, read_all(kafka.bootstrap_servers, conf["output_topic"]))
    assert len(read_all(kafka.bootstrap_servers, conf["output_topic"], "read_uncommitted")) == 120


def test_retry_schedule_longer_than_the_transaction_timeout_is_refused_at_plan(kafka, airflow, unique):
    name = f"k-guard-{unique}"
    conf, _ = new_pipeline(kafka, name, 30)
    dag = f"{TEST_DAG}_long_retries"
    airflow.wait_for_dag(dag)
    airflow.run(dag, f"{name}-1", conf)
    log = airflow.task_log(dag, f"{name}-1", "plan")
    assert "transaction_timeout_ms=120000 of the kafka sink is too short" in log
    assert "5 x retry_delay 180 s" in log and "Raise the sink's transaction_timeout_ms above 900000" in log
    assert "lower exactly_once.notify_complete's retries, retry_delay or execution_timeout" in log
    assert airflow.task_states(dag, f"{name}-1")["plan"] == ("failed", 1)  # not retried: retrying cannot help
    assert airflow_ledger(airflow).list_batches(name) == []
    assert set(settled_ends(kafka.bootstrap_servers, conf["output_topic"]).values()) == {0}
