"""A pipeline's metrics reach a StatsD server through Airflow's own metrics layer (airflow_integration/metrics.py).

The session's Airflow sends them to listeners on 127.0.0.1 (tests/conftest.py `statsd`: `[metrics] statsd_on`,
an allow list of `exactly_once`, InfluxDB-style tags so that the tags show in the datagrams): the tasks' to one,
the triggerer's to the other. tests/dags/eo_metrics_test_dag.py runs one batch of known records, and its
backlog watcher (which never fires) polls every 2 s.
"""

from __future__ import annotations

import json

from kafka import KafkaProducer

from tests.conftest import METRICS_PIPELINE
from tests.harness import airflow_ledger
from tests.helpers import create_topic, wait_for

DAG_ID = "eo_metrics"
PREFIX = "airflow.exactly_once"
P = METRICS_PIPELINE
PER_PARTITION, MAX_RECORDS = 12, 10  # one batch takes 10 of each partition's 12: lag 2 behind it
# Bad records, by (partition, offset): three inside the batch (malformed JSON, a wrong type, an amount the
# transform cannot divide by) and one after it, which this batch must not count.
BAD = {(0, 3): b'{"id": 1000, "amount"', (1, 5): b'{"id": "x", "amount": 1}', (2, 0): b'{"id": 1001, "amount": 0}',
       (2, 11): b"\x00 not json"}


def produce_known_records(bootstrap: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for partition in range(3):
        for offset in range(PER_PARTITION):
            value = BAD.get((partition, offset)) or json.dumps({"id": partition * 100 + offset, "amount": 1}).encode()
            producer.send(P, key=str(offset).encode(), value=value, partition=partition)
    producer.flush()
    producer.close()


def tagged(name: str, **tags: str) -> str:
    """The name of a tagged metric as Airflow's StatsD logger sends it with statsd_influxdb_enabled."""
    return ",".join([f"{PREFIX}.{name}", f"pipeline_id={P}", *(f"{k}={v}" for k, v in tags.items())])


def ours(listener, metric: str = "") -> set[str]:
    """The names `listener` received of this pipeline (other tests' pipelines send to the same listeners)."""
    def legacy(name: str) -> bool:  # exactly_once.<metric>.<pipeline>[.<tag values>]
        parts = name.split(".")
        return len(parts) > 3 and parts[3] == P

    return {n for n in listener.names(f"{PREFIX}.{metric}") if legacy(n) or f"pipeline_id={P}," in f"{n},"}


def test_one_batch_sends_its_counts_timings_lag_and_batches_in_flight(kafka, airflow, statsd, warm_spark):
    create_topic(kafka.bootstrap_servers, f"{P}-out", partitions=1)
    create_topic(kafka.bootstrap_servers, f"{P}-dlq", partitions=1)
    airflow.wait_for_dag(DAG_ID)
    tasks, triggerer = statsd.tasks, statsd.triggerer
    produce_known_records(kafka.bootstrap_servers)

    # Before any run, the watcher reports every record as waiting, per partition, under both names.
    def lag_seen_by_the_watcher(expected: int) -> bool:
        return all(triggerer.values(f"{PREFIX}.lag.{P}.{P}.{p}", "g")[-1:] == [expected]
                   and triggerer.values(tagged("lag", topic=P, partition=str(p)), "g")[-1:] == [expected]
                   for p in range(3))

    wait_for(lambda: lag_seen_by_the_watcher(PER_PARTITION), "the watcher's lag of the records produced", 60)
    assert ours(tasks) == set(), "metrics of this pipeline before its first run"

    assert airflow.run(DAG_ID, "metrics-1") == "success"
    [batch] = airflow_ledger(airflow).list_batches(P)
    assert (batch.input_records, batch.output_records, batch.details["bad_records"]["count"]) == (30, 27, 3)

    # Counted once, when the batch committed, under the legacy and the tagged name.
    for name, value, tags in (("records_read", 30, {}), ("records_written", 27, {}), ("batches_committed", 1, {}),
                              ("records_bad", 3, {"policy": "dead_letter"})):
        legacy = ".".join([f"{PREFIX}.{name}", P, *tags.values()])
        assert tasks.values(legacy, "c") == [value], name
        assert tasks.values(tagged(name, **tags), "c") == [value], name
    # One timing of each step, in ms.
    for phase in ("plan", "write", "notify_complete"):
        [legacy] = tasks.values(f"{PREFIX}.batch_duration.{P}.{phase}", "ms")
        [with_tags] = tasks.values(tagged("batch_duration", phase=phase), "ms")
        assert legacy == with_tags and legacy > 0, phase
    assert tasks.values(f"{PREFIX}.batch_duration.{P}.write", "ms")[0] > 100  # a Spark job, not a no-op
    # Plan's lag: the last stable offset minus the batch's end, per partition.
    for p in range(3):
        assert tasks.values(f"{PREFIX}.lag.{P}.{P}.{p}", "g") == [PER_PARTITION - MAX_RECORDS]
        assert tasks.values(tagged("lag", topic=P, partition=str(p)), "g") == [PER_PARTITION - MAX_RECORDS]
    # In flight: plan left one PLANNED batch, notify_complete none; the Kafka sink's deadline is the shorter of the
    # output's and the dead letters' transaction timeouts (120 s, 180 s), all of it left with nothing PREPARED.
    assert tasks.values(f"{PREFIX}.batches_in_flight.{P}", "g") == [1, 0]
    assert tasks.values(tagged("batches_in_flight"), "g") == [1, 0]
    assert tasks.values(f"{PREFIX}.oldest_prepared_age.{P}", "g") == [0, 0]
    assert tasks.values(f"{PREFIX}.oldest_prepared_deadline_left.{P}", "g") == [120, 120]
    assert tasks.values(f"{PREFIX}.oldest_prepared_deadline_used.{P}", "g") == [0, 0]
    # Nothing went wrong, so nothing else was sent.
    assert ours(tasks, "recoveries") | ours(tasks, "aborts") | ours(tasks, "data_loss") == set()

    # The watcher reports the same lag under the same names and tags (what waits beyond the batch), and the
    # batches in flight now that the ledger knows the pipeline.
    wait_for(lambda: lag_seen_by_the_watcher(PER_PARTITION - MAX_RECORDS), "the watcher's lag after the batch", 60)
    wait_for(lambda: triggerer.values(f"{PREFIX}.batches_in_flight.{P}", "g")[-1:] == [0]
             and triggerer.values(f"{PREFIX}.oldest_prepared_deadline_left.{P}", "g")[-1:] == [120],
             "the watcher's batches in flight", 60)
