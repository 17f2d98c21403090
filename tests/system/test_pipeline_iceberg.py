"""End to end, Airflow running the tasks: Kafka -> Spark -> Apache Iceberg, exactly once.

Real Kafka broker, real Spark (local mode, in the task process) with Iceberg's Spark runtime,
real Iceberg tables in the embedded catalog and in a JDBC catalog on the tests' PostgreSQL
(through the Airflow connection `eo_test_postgres`), real Airflow scheduler with LocalExecutor.
Crashes are SIGKILLs of the real task process at named protocol steps. Output is read back with
pyiceberg and compared with the input; no staged snapshot or ref but main is left behind.
"""

from __future__ import annotations

import pytest

from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.sinks import create_committer
from tests.conftest import ICEBERG_EXAMPLE_TOPIC, PG_CONN_ID, PG_DATABASE
from tests.harness import airflow_ledger
from tests.helpers import assert_exactly_once, assert_ranges_tile, create_topic, produce
from tests.integration.test_iceberg_sink import assert_nothing_staged, read_pyiceberg

TEST_DAG = "eo_iceberg_test"


def test_example_dag_two_batches(kafka, airflow, example_lakehouse):
    create_topic(kafka.bootstrap_servers, ICEBERG_EXAMPLE_TOPIC, partitions=3)
    produce(kafka.bootstrap_servers, ICEBERG_EXAMPLE_TOPIC, 600, json_values=True)
    airflow.wait_for_dag("kafka_to_iceberg")
    for n in range(2):  # 150 per partition and batch: 450 + 150
        assert airflow.run("kafka_to_iceberg", f"iceberg_{n}") == "success"
    sink = create_committer({"type": "iceberg", "table": "lake.events", "warehouse": str(example_lakehouse)})
    assert_exactly_once([str(i) for i in range(600)], [str(i) for i in read_pyiceberg(sink.target.table_committer, "id")])
    assert_nothing_staged(sink.target.table_committer)
    assert_ranges_tile(airflow_ledger(airflow), "kafka_to_iceberg")


# The points where the Iceberg sink's own state differs: a staged snapshot nobody published, a snapshot
# published before the ledger knew. plan.after_ledger and notify.after_ledger touch only the ledger; the
# Parquet system tests kill the task there (the protocol is the same for every sink).
@pytest.mark.parametrize("point, catalog", [
    ("write.after_stage", "postgres"),
    ("write.after_prepare", "embedded"),
    ("notify.after_sink_commit", "postgres"),
])
def test_worker_killed_at_protocol_step(kafka, postgres, airflow, faults, tmp_path, unique, point, catalog,
                                       warm_spark):
    name = f"ice-{point.replace('.', '-').replace('_', '-')}-{unique}"
    create_topic(kafka.bootstrap_servers, name)
    sent = produce(kafka.bootstrap_servers, name, 400)  # batches of 3 x 100: 300 + 100
    airflow.wait_for_dag(TEST_DAG)
    table = f"db.t_{unique}_{point.replace('.', '_')}"
    catalog_spec = {"type": "embedded"} if catalog == "embedded" else {"type": "postgres", "conn_id": PG_CONN_ID}
    conf = {"pipeline_id": name, "topic": name, "table": table, "warehouse": str(tmp_path / "lake"),
            "catalog": catalog_spec, "max_records": 100, **warm_spark}
    arm(faults, point, "kill", times=1)
    assert airflow.run(TEST_DAG, f"{name}-1", conf) == "success"
    assert (faults / "fired.log").read_text().count(point) == 1, "the crash point was never reached"
    assert airflow.run(TEST_DAG, f"{name}-2", conf) == "success"
    sink = create_committer({"type": "iceberg", "table": table, "warehouse": str(tmp_path / "lake"),
                        "catalog": {"type": "postgres", "url": postgres.dsn(PG_DATABASE)} if catalog == "postgres"
                        else {}})
    assert_exactly_once(sent, read_pyiceberg(sink.target.table_committer, "v"))
    assert_nothing_staged(sink.target.table_committer)
    assert_ranges_tile(airflow_ledger(airflow), name)

