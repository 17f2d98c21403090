"""The Iceberg sink through a REST catalog: Iceberg's own REST server (devtools.iceberg_rest), reached through a
gateway (devtools.rest_gateway) that checks the token, serves one warehouse, and loses or delays a commit's answer.

Spark writes the staged snapshot through the REST catalog, pyiceberg publishes it through the same catalog.
A commit whose answer is lost (the server killed after applying it) or late (past the client's timeout) is an
unknown outcome: the retry finds the batch in main's history, commits nothing twice and deletes nothing the table
uses.
"""

from __future__ import annotations

import os
import uuid

import pytest

from airflow_exactly_once.core.errors import ConfigurationError, SinkError
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.sinks import create_committer
from airflow_exactly_once.sinks.iceberg.table_committer import TableCommitter
from airflow_exactly_once.sinks.iceberg.outcomes import CommitOutcomeUnknown
from tests.conftest import REST_CREDENTIAL, REST_TOKEN, REST_WAREHOUSE
from tests.harness import FakeSource, Pipe, open_ledger, pipeline_config
from tests.helpers import iceberg_staged
from tests.integration.test_iceberg_sink import Pipeline, frame, read_pyiceberg, read_spark


def rest_spec(gateway, create_table: bool = True, **catalog) -> dict:
    name = uuid.uuid4().hex[:8]  # one Spark session serves every test: a catalog name per test
    given = {"type": "rest", "name": f"r{name}", "uri": gateway.uri, "token": REST_TOKEN, **catalog}
    return {"type": "iceberg", "table": f"db.t_{name}", "warehouse": REST_WAREHOUSE,
            "catalog": {k: v for k, v in given.items() if v is not None}, "create_table": create_table}


def batches_in_main(committer: TableCommitter) -> list[str]:
    return [s.summary.get("aeo.batch") for s in committer.main_history(committer.load())]


def missing_files(committer: TableCommitter) -> list[str]:
    """Data files main reads that are not on disk (what a cleanup after an unknown commit would leave)."""
    return [path for path in committer.live_files(committer.load()) if not os.path.exists(path.removeprefix("file:"))]


def test_batches_through_a_rest_catalog_exactly_once(spark, iceberg_rest, rest_gateway, tmp_path):
    """plan -> write (Spark, REST) -> notify_complete (pyiceberg, REST): exact rows, one snapshot per batch, a replay
    commits nothing; the OAuth2 credential is exchanged for the token by both clients."""
    spec = rest_spec(rest_gateway, token=None, credential=REST_CREDENTIAL)
    pipe = Pipeline(tmp_path, spec, max_records_per_partition=10)
    committer = pipe.sink.target.table_committer
    written = []
    for run, start in (("run-1", 0), ("run-2", 10)):
        batch = pipe.plan(run).batch
        df, values = frame(spark, start, 10)
        prepared = pipe.write(batch.id, df)
        assert read_pyiceberg(committer) == sorted(written)  # nothing of the PREPARED batch on main
        assert "published" in pipe.commit(prepared.id)
        assert "already" in pipe.new_coordinator().commit(prepared.id)  # a replayed notify_complete
        written += values
    assert read_pyiceberg(committer) == sorted(written)
    assert read_spark(spark, pipe.sink.target) == sorted(written)
    assert batches_in_main(committer) == [f"{pipe.config.pipeline_id}:2", f"{pipe.config.pipeline_id}:1"]
    assert iceberg_staged(committer) == []
    assert str(iceberg_rest.warehouse) in committer.load().location()  # the server placed it: the sink named none


def test_a_commit_applied_but_unanswered_is_found_by_recovery(spark, iceberg_rest, rest_gateway, tmp_path):
    """The server applies the cherry-pick, then is SIGKILLed before it answers: the commit's outcome is unknown.
    After a restart, recovery (the next plan) finds the batch in main's history: once, every file there."""
    pipe = Pipeline(tmp_path, rest_spec(rest_gateway), max_records_per_partition=10)
    committer = pipe.sink.target.table_committer
    (a, va), (b, vb) = frame(spark, 0, 10), frame(spark, 10, 10)
    first, second = pipe.write(pipe.planted(10).id, a), pipe.write(pipe.planted(10).id, b)
    assert "fast-forward" in pipe.commit(second.id)
    rest_gateway.lose_next_commit_answer(then=iceberg_rest.kill)
    with pytest.raises(CommitOutcomeUnknown, match="(?s)outcome of the commit .* is unknown.*reads the table's "
                                                   "snapshots") as err:
        pipe.commit(first.id)  # a cherry-pick: new manifests, the staged snapshot's data files
    assert err.value.retriable
    assert pipe.state(first.id) is BatchState.PREPARED  # the offsets did not move
    assert iceberg_rest.process is None  # killed by the gateway once the server had answered it
    iceberg_rest.start()
    assert f"{pipe.config.pipeline_id}:{first.seq}" in batches_in_main(committer)  # the lost commit had landed
    pipe.coordinator = pipe.new_coordinator()  # the next run's process
    pipe.plan("run-next")  # recovery first: the PREPARED batch is committed (found published) before planning
    assert pipe.state(first.id) is BatchState.COMMITTED
    assert sorted(batches_in_main(committer)) == sorted(f"{pipe.config.pipeline_id}:{b.seq}" for b in (first, second))
    assert missing_files(committer) == []
    assert read_pyiceberg(committer) == sorted(va + vb)
    assert iceberg_staged(committer) == []


def test_a_commit_answered_after_the_timeout_is_found_by_the_retry(spark, rest_gateway, tmp_path):
    """The server applies the fast-forward, its answer comes after the client's socket timeout: unknown; the
    notify_complete retry finds it published."""
    spec = rest_spec(rest_gateway, properties={"rest.client.socket-timeout-ms": "1500"})
    pipe = Pipeline(tmp_path, spec)
    committer = pipe.sink.target.table_committer
    df, values = frame(spark, 0, 10)
    prepared = pipe.write(pipe.planted(10).id, df)
    rest_gateway.delay_next_commit_answer(4.0)
    with pytest.raises(CommitOutcomeUnknown, match="unknown.*Timeout"):
        pipe.commit(prepared.id)
    assert pipe.state(prepared.id) is BatchState.PREPARED
    assert "already published" in pipe.new_coordinator().commit(prepared.id)  # Airflow's retry of notify_complete
    assert pipe.state(prepared.id) is BatchState.COMMITTED
    assert batches_in_main(committer) == [f"{pipe.config.pipeline_id}:{prepared.seq}"]
    assert missing_files(committer) == []
    assert read_pyiceberg(committer) == sorted(values)


# -- bad input: a clear error at plan time, nothing planned -----------------------------------------------------

def plan_fails(tmp_path, spec: dict, expected: type[Exception] = SinkError) -> Exception:
    config = pipeline_config(f"rest-{uuid.uuid4().hex[:8]}", ["t"], spec)
    pipe = Pipe(config, open_ledger(tmp_path / f"{config.pipeline_id}.db"), lambda: FakeSource({("t", 0): 10}))
    with pytest.raises(expected) as err:
        pipe.plan("run-1")
    assert pipe.ledger.list_batches(config.pipeline_id, list(BatchState)) == []  # nothing planned, nothing lost
    return err.value


def test_a_refused_token_or_credential_is_a_clear_error_not_retried(rest_gateway, tmp_path):
    for catalog in ({"token": "not-the-token"}, {"token": None, "credential": "pipeline:wrong-secret"}):
        error = plan_fails(tmp_path, rest_spec(rest_gateway, **catalog))
        assert not error.retriable
        assert "refused the sink's credentials" in str(error) and "'token'" in str(error)
        assert "not-the-token" not in str(error) and "wrong-secret" not in str(error)


def test_an_unreachable_catalog_is_retriable_and_names_the_uri(tmp_path):
    from devtools.ports import reserve_port

    uri = f"http://127.0.0.1:{reserve_port()}"  # nothing listens there
    spec = {"type": "iceberg", "table": "db.t", "catalog": {"type": "rest", "uri": uri}}
    error = plan_fails(tmp_path, spec)
    assert error.retriable and f"cannot reach the Iceberg REST catalog at {uri}" in str(error)


def test_a_warehouse_the_catalog_does_not_serve_is_a_configuration_error(rest_gateway, tmp_path):
    error = plan_fails(tmp_path, {**rest_spec(rest_gateway), "warehouse": "elsewhere"}, ConfigurationError)
    assert "does not serve the warehouse 'elsewhere'" in str(error) and "set the sink's 'warehouse'" in str(error)


def test_a_missing_table_is_a_plan_time_error_unless_created(rest_gateway, tmp_path):
    spec = rest_spec(rest_gateway, create_table=False)
    error = plan_fails(tmp_path, spec, ConfigurationError)
    assert "does not exist in the Iceberg REST catalog" in str(error) and "'create_table': True" in str(error)
    create_committer({**spec, "create_table": True}).check("p")  # created by the first write


def test_the_table_name_in_lineage_is_its_location(spark, rest_gateway, tmp_path):
    pipe = Pipeline(tmp_path, rest_spec(rest_gateway))
    before = pipe.sink.lineage_dataset()  # no table yet: named in the catalog
    assert before.name.endswith(pipe.sink.target.table) and rest_gateway.uri in before.namespace
    pipe.commit(pipe.write(pipe.planted(3).id, frame(spark, 0, 3)[0]).id)
    after = pipe.sink.lineage_dataset()
    assert after.namespace == "file" and after.name.endswith(f"/db/{pipe.sink.target.table_name}")
