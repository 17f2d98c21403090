"""End to end in a real Airflow: a Kafka -> Kafka pipeline whose only Kafka settings are a `kafka` connection.

The connection (AIRFLOW_CONN_KAFKA_SECURED, see tests/conftest.py) logs in to the secured broker
with SCRAM-SHA-512 over TLS; its extra is all the DAG (tests/dags/eo_secured_test_dag.py) knows,
so the run succeeding proves every client read it: planning (kafka-python), Spark's Java client,
the sink's producers on the executors and its committer. A second connection with a wrong
password shows what operators see: the plan fails once, not retried, naming the setting.
"""

from __future__ import annotations

from airflow_exactly_once.core.states import BatchState
from tests.conftest import PIPELINE_USER, SECURED_BAD_PASSWORD_CONN_ID, SECURED_IN, SECURED_OUT
from tests.harness import airflow_ledger
from tests.helpers import assert_exactly_once, assert_ranges_tile, create_topic, produce
from tests.kafka_helpers import read_all

TEST_DAG = "eo_secured_test"


def test_a_pipeline_runs_exactly_once_through_the_secured_connection(secured_kafka, airflow, unique):
    name, source, output = f"sec-af-{unique}", f"{SECURED_IN}{unique}", f"{SECURED_OUT}{unique}"
    admin = secured_kafka.client_config()
    create_topic(admin, source, partitions=3)
    create_topic(admin, output, partitions=2)
    sent = produce(admin, source, 90)
    conf = {"pipeline_id": name, "topic": source, "output_topic": output}
    airflow.wait_for_dag(TEST_DAG)

    assert airflow.run(TEST_DAG, f"{name}-1", conf) == "success", airflow.task_states(TEST_DAG, f"{name}-1")
    assert_exactly_once([v.upper() for v in sent], read_all(admin, output))
    ledger = airflow_ledger(airflow)
    [batch] = ledger.list_batches(name)
    assert batch.state is BatchState.COMMITTED and batch.output_records == 90
    assert_ranges_tile(ledger, name)
    stored = ledger.pipeline(name)["config"]
    assert stored["kafka_origin"] == "connection 'kafka_secured'"
    assert stored["kafka_config"]["sasl.username"] == PIPELINE_USER and stored["kafka_config"]["sasl.password"] == "***"
    assert stored["kafka_config"]["security.protocol"] == "SASL_SSL"

    bad = f"{name}-bad"
    run = f"{bad}-1"
    assert airflow.run(TEST_DAG, run, {**conf, "pipeline_id": bad,
                                       "kafka_conn_id": SECURED_BAD_PASSWORD_CONN_ID}) == "failed"
    assert airflow.task_states(TEST_DAG, run)["plan"] == ("failed", 1)  # not retried: retrying cannot help
    log = airflow.task_log(TEST_DAG, run, "plan")
    assert f"refused the SASL login of user {PIPELINE_USER!r}" in log
    assert f"fix sasl.username and sasl.password (or sasl.jaas.config) in connection " \
           f"{SECURED_BAD_PASSWORD_CONN_ID!r}" in log
    assert ledger.list_batches(bad) == []
