"""The freshness benchmark's smoke run (issue 51): benchmarks/bench_freshness.py's own functions, one minute at a
low rate, on the session's Airflow (its triggerer, scheduler and PostgreSQL metadata), broker and warm Spark
Connect server: the benchmark's DAG is linked into the session's DAG folder as the benchmark links it into its own.

It asserts that the run finishes and is exact (every produced id visible once to a read_committed consumer, runs
started by arriving data only, none failed); no latency figure (the benchmark prints those). What it adds to CI:
the test itself, 86 s on the shared 2-core machine (load 6): the DAG's parse and the trigger's start, a minute of
producing, then the last run. The session's servers it reuses are started for the other system tests anyway.
"""

from __future__ import annotations

import uuid

from benchmarks.bench_freshness import DagSettings, create_topics, install_dag, measure_ours
from tests.dags.exactly_once_connect_test_dag import SPARK_CONN_ID

RATE, SECONDS = 50, 60
POLL_SECONDS = 5.0  # the provider's default (DEFAULT_POLL_SECONDS), written out so that a later default does not slow CI


def test_one_minute_at_fifty_records_a_second_is_exact(airflow, kafka, warm_spark):
    name = f"freshness_smoke_{uuid.uuid4().hex[:6]}"
    settings = DagSettings(dag_id=name, pipeline_id=name, input_topic=f"{name}_in", output_topic=f"{name}_out",
                           spark_conn_id=SPARK_CONN_ID, poll_interval_seconds=POLL_SECONDS)
    create_topics(kafka.bootstrap_servers, [settings.input_topic, settings.output_topic])
    install_dag(airflow.dags_folder, settings)

    result = measure_ours(airflow, kafka.bootstrap_servers, settings, RATE, SECONDS, drain_timeout=300)

    produced = RATE * SECONDS
    assert result.stream.exactness.produced == produced
    assert result.stream.exactness.exact, result.stream.exactness
    assert result.stream.records == produced
    runs = airflow.runs(settings.dag_id)
    assert runs and all(r["run_type"] == "asset_triggered" for r in runs), runs
    assert result.breakdown["failed"] == 0 and result.breakdown["runs"] == len(runs), result.breakdown
    # the ledger's committed batches hold every record, once
    assert sum(result.batch_records) == produced, result.batch_records
    assert result.breakdown["seconds"]["write"] > 0 and 0 < result.breakdown["share"]["write"] < 1, result.breakdown
