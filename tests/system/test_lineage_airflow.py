"""OpenLineage events of a pipeline's tasks, from a real Airflow running the OpenLineage provider.

The session's Airflow writes OpenLineage events to a file (tests/conftest.py: openlineage_env), for the
DAGs that call `enable_lineage` only. Three batches: one left PREPARED by a run whose notify_complete
failed for good, which the next run's plan recovers (recovered), that run's own (committed), and one
whose transform raises (aborted). Each task's events name the topic as input, the Parquet output as
output, and carry the batch, its offsets and counts, and its state in the ledger.
"""

from __future__ import annotations

import json
from pathlib import Path

from airflow_exactly_once.core.faults import arm
from airflow_exactly_once.core.states import BatchState
from tests.harness import airflow_ledger
from tests.helpers import create_topic, produce

DAG, FAILING_DAG = "eo_lineage_test", "eo_lineage_test_failing"


def events_of(path: Path, dag: str, run_id: str) -> dict[tuple[str, str], dict]:
    """(task, eventType) -> the event, of one DAG run's tasks."""
    found = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        airflow_facet = event["run"]["facets"].get("airflow") or {}
        if (airflow_facet.get("dagRun") or {}).get("run_id") != run_id or "." not in event["job"]["name"]:
            continue  # another run's, or the DAG's own (job name: the DAG id)
        assert event["job"]["name"].startswith(f"{dag}."), event["job"]["name"]
        found[(event["job"]["name"].rpartition(".")[2], event["eventType"])] = event
    return found


def batch_facet(event: dict) -> dict:
    return event["run"]["facets"]["exactlyOnceBatch"]


def test_committed_recovered_and_aborted_batches_in_openlineage_events(kafka, airflow, warm_spark, faults,
                                                                         openlineage_events, tmp_path, unique):
    name = f"lineage-{unique}"
    create_topic(kafka.bootstrap_servers, name, partitions=3)
    output = tmp_path / name
    conf = {"pipeline_id": name, "topic": name, "output": str(output), **warm_spark}
    airflow.wait_for_dag(DAG)
    airflow.wait_for_dag(FAILING_DAG)

    # Run 1: notify_complete fails on every attempt before committing: batch 1 stays PREPARED.
    produce(kafka.bootstrap_servers, name, 30)
    arm(faults, "notify.before_sink_commit", "raise", times=3)
    assert airflow.run(DAG, f"{name}-1", conf) == "failed"
    # Run 2: its plan recovers batch 1, then plans, writes and commits batch 2.
    produce(kafka.bootstrap_servers, name, 12, start=30)
    assert airflow.run(DAG, f"{name}-2", conf) == "success"
    # Run 3 (its transform raises): batch 3 is aborted.
    produce(kafka.bootstrap_servers, name, 6, start=42)
    assert airflow.run(FAILING_DAG, f"{name}-3", conf) == "failed"
    ledger = airflow_ledger(airflow)
    b1, b2, b3 = ledger.list_batches(name, newest_first=False)
    assert (b1.state, b2.state, b3.state) == (BatchState.COMMITTED, BatchState.COMMITTED, BatchState.ABORTED)

    topic = {"namespace": f"kafka://{kafka.bootstrap_servers.split(',')[0]}", "name": name}
    parquet = {"namespace": "file", "name": str(output)}

    def datasets(event: dict, key: str) -> list[dict]:
        return [{"namespace": d["namespace"], "name": d["name"]} for d in event[key]]

    def ranges(batch) -> list[dict]:
        return [{"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end} for r in batch.ranges]

    run2 = events_of(openlineage_events, DAG, f"{name}-2")
    plan = run2[("plan", "COMPLETE")]
    assert batch_facet(plan)["recoveredBatches"] == [str(b1.id)]  # the recovered batch
    assert (batch_facet(plan)["batchSeq"], batch_facet(plan)["state"]) == (b2.seq, "PLANNED")  # as plan left it
    notify = run2[("notify_complete", "COMPLETE")]
    assert datasets(notify, "inputs") == [topic] and datasets(notify, "outputs") == [parquet]
    facet = batch_facet(notify)
    assert (facet["pipelineId"], facet["batchId"], facet["state"]) == (name, str(b2.id), "COMMITTED")
    assert facet["ranges"] == ranges(b2) and sum(r["end"] - r["start"] for r in facet["ranges"]) == 12
    assert (facet["inputRecords"], facet["outputRecords"]) == (12, 12)
    assert notify["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 12
    assert notify["inputs"][0]["inputFacets"]["inputStatistics"]["rowCount"] == 12
    start = run2[("write", "START")]  # before the step runs: the datasets, no batch yet
    assert datasets(start, "outputs") == [parquet] and "batchId" not in batch_facet(start)  # None is left out

    run1 = events_of(openlineage_events, DAG, f"{name}-1")
    failed = run1[("notify_complete", "FAIL")]
    assert (batch_facet(failed)["batchId"], batch_facet(failed)["state"]) == (str(b1.id), "PREPARED")
    assert batch_facet(run1[("write", "COMPLETE")])["ranges"] == ranges(b1)

    run3 = events_of(openlineage_events, FAILING_DAG, f"{name}-3")
    assert batch_facet(run3[("write", "FAIL")])["state"] == "PLANNED"  # the abort task runs after it
    aborted = batch_facet(run3[("abort", "COMPLETE")])
    assert (aborted["batchId"], aborted["state"], aborted.get("outputRecords")) == (str(b3.id), "ABORTED", None)
