"""End to end, Airflow running the tasks: Kafka -> Spark -> PostgreSQL with PREPARE/COMMIT PREPARED.

Real Kafka broker, real Spark (local mode, in the task process), real PostgreSQL (which also
holds the offset ledger here), real Airflow scheduler with LocalExecutor. Crashes are SIGKILLs
of the real task process at named protocol steps, and `pg_ctl -m immediate` for the server.
Every test ends with the table equal to the input and pg_prepared_xacts empty.
"""

from __future__ import annotations

from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.states import BatchState
from tests.conftest import PG_DATABASE, PG_EXAMPLE_TOPIC
from tests.helpers import assert_exactly_once, assert_ranges_tile, create_topic, pg_query, produce

TEST_DAG = "eo_postgres_test"


def sql(postgres, statement: str, params=()) -> list[tuple]:
    return pg_query(postgres.dsn(PG_DATABASE), statement, params)


def make_table(postgres, name: str, check: str = "true") -> str:
    table = name.replace("-", "_")
    sql(postgres, f'CREATE TABLE {table} (k text, v text NOT NULL CHECK ({check}), topic text, '
                  f'"partition" int, "offset" bigint, PRIMARY KEY (topic, "partition", "offset"))')
    return table


def values_in(postgres, table: str) -> list[str]:
    return [r[0] for r in sql(postgres, f"SELECT v FROM {table}")]


def prepared_xacts(postgres) -> list[str]:
    return [r[0] for r in sql(postgres, "SELECT gid FROM pg_prepared_xacts")]


def ledger_of(postgres) -> Ledger:
    return Ledger(postgres.url(PG_DATABASE))


def conf(name: str, table: str, warm_spark: dict[str, str], max_records: int = 100) -> dict:
    return {"pipeline_id": name, "topic": name, "table": table, "mode": "insert", "max_records": max_records,
            **warm_spark}


def clear_task(airflow, dag_id: str, run_id: str, task_id: str) -> None:
    """What "Clear" on one task instance does in the UI: only that task runs again."""
    airflow.api("POST", f"/dags/{dag_id}/clearTaskInstances",
                {"dag_run_id": run_id, "task_ids": [task_id], "dry_run": False, "only_failed": False,
                 "reset_dag_runs": True})


def test_example_dag_and_notify_complete_run_twice(kafka, postgres, airflow):
    create_topic(kafka.bootstrap_servers, PG_EXAMPLE_TOPIC, partitions=3)
    produce(kafka.bootstrap_servers, PG_EXAMPLE_TOPIC, 300, json_values=True)
    airflow.wait_for_dag("kafka_to_postgres")
    assert airflow.run("kafka_to_postgres", "pg_1") == "success"  # creates the table, then one batch

    clear_task(airflow, "kafka_to_postgres", "pg_1", "exactly_once.notify_complete")
    assert airflow.wait_run("kafka_to_postgres", "pg_1") == "success"
    assert airflow.task_states("kafka_to_postgres", "pg_1")["notify_complete"] == ("success", 2)
    assert "was already committed" in airflow.task_log("kafka_to_postgres", "pg_1", "notify_complete")

    rows = sql(postgres, "SELECT id, name, kafka_timestamp FROM events")
    assert_exactly_once([str(i) for i in range(300)], [str(r[0]) for r in rows])
    assert {r[1] for r in rows} == {f"item-{i}" for i in range(300)} and all(r[2] for r in rows)
    ledger = ledger_of(postgres)  # the ledger lives in PostgreSQL too
    [batch] = ledger.list_batches("kafka_to_postgres")
    assert batch.state is BatchState.COMMITTED and batch.output_records == 300
    assert_ranges_tile(ledger, "kafka_to_postgres")
    assert prepared_xacts(postgres) == []


def test_worker_killed_between_postgres_and_the_ledger(kafka, postgres, airflow, faults, unique, warm_spark):
    """Two SIGKILLs in one run: after PREPARE (before the ledger says PREPARED), then after
    COMMIT PREPARED (before the ledger says COMMITTED). Airflow retries each task once."""
    name = f"pgkill-{unique}"
    table = make_table(postgres, name)
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 300)
    airflow.wait_for_dag(TEST_DAG)
    points = ("write.after_stage", "notify.after_sink_commit")
    for point in points:
        arm(faults, point, "kill", times=1)
    airflow.run(TEST_DAG, f"{name}-1", conf(name, table, warm_spark))
    fired = (faults / "fired.log").read_text()
    assert all(fired.count(p) == 1 for p in points), fired
    states = airflow.task_states(TEST_DAG, f"{name}-1")
    assert states["write"] == states["notify_complete"] == ("success", 2), states  # killed, then retried
    assert states["abort"][0] == "skipped"

    assert_exactly_once(sent, values_in(postgres, table))
    assert prepared_xacts(postgres) == []  # the killed write's prepared transactions are gone
    ledger = ledger_of(postgres)
    [batch] = ledger.list_batches(name)
    assert batch.state is BatchState.COMMITTED
    markers = sql(postgres, "SELECT gid FROM airflow_exactly_once_markers WHERE pipeline_id = %s", (name,))
    assert sorted(m[0] for m in markers) == sorted(batch.handles["gids"])  # only the live attempt's
    gids = len(batch.handles["gids"])  # one prepared transaction per Spark partition of the write that lived
    assert gids >= 1 and f"0 now, {gids} already" in airflow.task_log(TEST_DAG, f"{name}-1", "notify_complete")
    assert_ranges_tile(ledger, name)


def test_postgres_crashes_and_restarts_between_write_and_notify(kafka, postgres, airflow, faults, unique, warm_spark):
    name = f"pgcrash-{unique}"
    table = make_table(postgres, name)
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 240)
    airflow.wait_for_dag(TEST_DAG)
    arm(faults, "notify.before_sink_commit", "raise", times=3)  # notify_complete fails, all 3 tries
    assert airflow.run(TEST_DAG, f"{name}-1", conf(name, table, warm_spark)) == "failed"
    states = airflow.task_states(TEST_DAG, f"{name}-1")
    # abort only follows write: a PREPARED batch is left for notify_complete or recovery
    assert states["notify_complete"] == ("failed", 3) and states["abort"][0] == "skipped", states
    [batch] = ledger_of(postgres).list_batches(name)
    assert batch.state is BatchState.PREPARED
    assert sorted(prepared_xacts(postgres)) == sorted(batch.handles["gids"])

    postgres.stop(mode="immediate")  # a crash: no checkpoint; WAL recovery on start
    postgres.start()
    assert sorted(prepared_xacts(postgres)) == sorted(batch.handles["gids"])  # survived
    assert values_in(postgres, table) == []

    airflow.clear(TEST_DAG, f"{name}-1", only_failed=True)  # the operator re-runs notify_complete
    assert airflow.wait_run(TEST_DAG, f"{name}-1") == "success"
    assert_exactly_once(sent, values_in(postgres, table))
    assert prepared_xacts(postgres) == []
    assert ledger_of(postgres).get_batch(batch.id).state is BatchState.COMMITTED


def test_a_row_violating_a_constraint_fails_the_batch_and_changes_nothing(kafka, postgres, airflow, unique, warm_spark):
    name = f"pgbad-{unique}"
    table = make_table(postgres, name, check="v <> 'value-40'")
    create_topic(kafka.bootstrap_servers, name)
    first = produce(kafka.bootstrap_servers, name, 30)
    airflow.wait_for_dag(TEST_DAG)
    assert airflow.run(TEST_DAG, f"{name}-1", conf(name, table, warm_spark)) == "success"
    ledger = ledger_of(postgres)
    before = ledger.committed_positions(name)

    produce(kafka.bootstrap_servers, name, 30, start=30)  # value-40 violates the table's check
    assert airflow.run(TEST_DAG, f"{name}-2", conf(name, table, warm_spark)) == "failed"
    log = airflow.task_log(TEST_DAG, f"{name}-2", "write")
    assert f"check constraint '{table}_v_check' on {table} was violated" in log
    assert "Fix: correct the offending values, or change the check constraint" in log
    states = airflow.task_states(TEST_DAG, f"{name}-2")
    assert states["write"] == ("failed", 1), states  # not retried: retrying cannot pass
    assert states["abort"][0] == "success", states

    assert_exactly_once(first, values_in(postgres, table))
    assert ledger.committed_positions(name) == before
    assert [b.state for b in ledger.list_batches(name)] == [BatchState.ABORTED, BatchState.COMMITTED]
    markers = sql(postgres, "SELECT batch_seq FROM airflow_exactly_once_markers WHERE pipeline_id = %s", (name,))
    assert {m[0] for m in markers} == {1}
    assert prepared_xacts(postgres) == []
