"""The ledger page's FastAPI app, mounted by Airflow's api-server under /exactly-once (see ui/plugin.py).

Authentication and permissions are Airflow's own, as in the official providers' FastAPI
plugins: the user comes from Airflow's JWT (the UI's cookie, or a bearer token), and a
pipeline is listed only when Airflow's auth manager lets that user read the DAGs that drive
it (ui/access.py). Read-only: the ledger is opened read-only and Kafka is only asked for
offsets. The endpoints are plain functions, so FastAPI runs them in its thread pool and a
slow ledger or broker never blocks the api-server's event loop.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from datetime import datetime, timezone
from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep
from airflow.configuration import conf
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from fastapi import FastAPI, HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import HTMLResponse, JSONResponse
from sqlalchemy import select

from airflow_exactly_once.airflow_integration.provider_info import CONFIG_SECTION
from airflow_exactly_once.observe.backlog import PipelineReport, utc
from airflow_exactly_once.hooks.ledger import LedgerHook
from airflow_exactly_once.ui.access import pipeline_dag_ids, reads_every_dag, visible_pipelines
from airflow_exactly_once.ui.loading import (
    DEFAULT_KAFKA_TIMEOUT_MS,
    DriftResult,
    LagResult,
    LedgerReader,
    LedgerUnavailable,
    PipelineSummary,
    read_drift,
    read_lag,
)
from airflow_exactly_once.ui.page import error_page, pipeline_page

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_RUN_ID_CHUNK = 500


def ledger_hook() -> LedgerHook:
    """The ledger the page reads: [exactly_once] ledger_conn_id or ledger_url, else the embedded file (like the tasks)."""
    conn_id = conf.get(CONFIG_SECTION, "ledger_conn_id", fallback=None) or None
    url = conf.get(CONFIG_SECTION, "ledger_url", fallback=None) or None
    return LedgerHook(ledger_conn_id=conn_id, ledger_url=url)


def ledger_warning(hook: LedgerHook) -> str | None:
    """When the page reads the embedded file of its own machine while the pipelines' tasks refuse the embedded
    ledger (they may run on other machines): what the page shows is then not the pipelines' ledger."""
    problem = hook.placement_problem()
    return (f"This page reads the embedded ledger of the api-server's own AIRFLOW_HOME, which the pipelines' tasks "
            f"refuse: {problem} Point the page at the pipelines' ledger with [{CONFIG_SECTION}] ledger_conn_id "
            "(or ledger_url).") if problem else None


def kafka_timeout_ms() -> int:
    return conf.getint(CONFIG_SECTION, "kafka_timeout_ms", fallback=DEFAULT_KAFKA_TIMEOUT_MS)


def _dags_of_runs(session: Any, run_ids: set[str]) -> set[str]:
    """The DAGs whose runs carry these run ids (for pipelines whose plan tasks did not record their DAG)."""
    ids = sorted(run_ids)
    found: set[str] = set()
    for i in range(0, len(ids), _RUN_ID_CHUNK):
        found.update(session.scalars(select(DagRun.dag_id).where(DagRun.run_id.in_(ids[i:i + _RUN_ID_CHUNK]))
                                     .distinct()))
    return found


def visible(reader: LedgerReader, user: Any, session: Any) -> list[PipelineSummary]:
    """The ledger's pipelines that `user` may see, each with the DAGs it belongs to."""
    summaries = reader.pipelines()
    recorded = {s.pipeline_id: s.dag_ids for s in summaries}
    dags_of = pipeline_dag_ids(recorded, recorded, lambda p: _dags_of_runs(session, reader.run_ids(p)))
    auth_manager = get_auth_manager()
    every_dag = set().union(*dags_of.values()) if dags_of else set()
    readable = auth_manager.filter_authorized_dag_ids(dag_ids=every_dag, user=user, method="GET") if every_dag else set()
    reads_all = reads_every_dag(auth_manager.is_authorized_dag(method="GET", user=user),
                                set(session.scalars(select(DagModel.dag_id))),
                                auth_manager.get_authorized_dag_ids(user=user, method="GET", session=session))
    names = set(visible_pipelines(dags_of, readable, reads_all))
    return [replace(s, dag_ids=dags_of[s.pipeline_id]) for s in summaries if s.pipeline_id in names]


def report_json(report: PipelineReport, lag: LagResult, drift: DriftResult) -> dict[str, Any]:
    """The page's content as JSON (GET /exactly-once/api/pipelines/<id>)."""
    def tp(key: tuple[str, int]) -> str:
        return f"{key[0]}:{key[1]}"

    return {
        "pipeline_id": report.pipeline_id, "epoch": report.epoch, "dag_ids": sorted(report.dag_ids),
        "topics": report.topics, "topic_pattern": report.topic_pattern, "sink": report.sink_type,
        "counts": report.counts, "last_seq": report.last_seq,
        "commit_deadline_ms": report.commit_deadline_ms,
        "retention": {"describe": report.retention, "pruned_through": report.pruned_through},
        "committed": {tp(k): v for k, v in sorted(report.committed.items())},
        "batches": [{"seq": b.seq, "run_id": b.run_id, "state": b.state.value, "epoch": b.epoch,
                     "input_records": b.input_records, "output_records": b.output_records,
                     "created_at": b.created_at, "updated_at": b.updated_at, "duration_s": b.duration_s,
                     "error": b.error,
                     "ranges": [r.as_dict() for r in b.ranges]} for b in report.batches],
        "in_flight": [{"seq": b.seq, "run_id": b.run_id, "state": b.state.value, "age_s": b.age_s,
                       "deadline_s": b.deadline_s, "overdue": b.overdue} for b in report.in_flight],
        "lag": {"servers": lag.servers, "error": lag.error, "total": lag.total,
                "partitions": [{"topic": r.topic, "partition": r.partition, "committed": r.committed,
                                "last_stable": r.last_stable, "log_start": r.log_start, "lag": r.lag}
                               for r in lag.rows]},
        "events": [{"at": e["at"], "kind": e["kind"], "batch_seq": e.get("batch_seq"), "message": e["message"]}
                   for e in report.events],
        "drift": {"errors": drift.errors, "ok": drift.report.ok if drift.report else None,
                  "compared": drift.report.compared if drift.report else [],
                  "findings": [asdict(f) for f in drift.report.findings] if drift.report else []},
    }


def _reader() -> LedgerReader:
    try:
        hook = ledger_hook()
        return LedgerReader(hook.get_url(), hook.describe(), ledger_warning(hook))
    except Exception as exc:  # a missing connection, a bad URL: the page says so instead of failing
        raise LedgerUnavailable(f"the ledger is not configured correctly ([{CONFIG_SECTION}] ledger_conn_id / "
                                f"ledger_url): {type(exc).__name__}: {exc}") from exc


def create_app() -> FastAPI:
    app = FastAPI(title="Exactly-once ledger", description="Read-only view of the offset ledger of exactly-once "
                  "pipelines (airflow-exactly-once)", docs_url=None, redoc_url=None)

    @app.get("/ui", response_class=HTMLResponse, include_in_schema=False)
    def ledger_page(request: Request, user: GetUserDep, session: SessionDep, pipeline: str | None = None
                    ) -> HTMLResponse:
        now = datetime.now(timezone.utc)
        base = request.url.path
        description, warning = "(not configured)", None
        try:
            reader = _reader()
            description, warning = reader.description, reader.warning
            pipelines = visible(reader, user, session)
            names = [p.pipeline_id for p in pipelines]
            # Unless one is asked for: the pipeline that changed last (most likely the one being looked after).
            newest = max(pipelines, key=lambda p: utc(p.updated_at) or EPOCH).pipeline_id if pipelines else None
            chosen = pipeline if pipeline in names else newest
            notice = (f"No pipeline {pipeline!r} that you may see; showing {chosen}." if pipeline and chosen != pipeline
                      else None)
            report = reader.report(chosen, now=now) if chosen else None
        except LedgerUnavailable as exc:
            return HTMLResponse(error_page(description, str(exc), now, warning), status_code=503)
        if report is not None:
            report.dag_ids = next(p.dag_ids for p in pipelines if p.pipeline_id == chosen)
        lag = read_lag(report, kafka_timeout_ms()) if report is not None else None
        drift = read_drift(reader, report, session, kafka_timeout_ms()) if report is not None else None
        return HTMLResponse(pipeline_page(ledger=description, now=now, pipelines=pipelines, report=report, lag=lag,
                                          base=base, notice=notice, drift=drift, ledger_warning=warning))

    @app.get("/api/pipelines")
    def list_pipelines(user: GetUserDep, session: SessionDep) -> JSONResponse:
        try:
            reader = _reader()
            pipelines = visible(reader, user, session)
        except LedgerUnavailable as exc:
            raise HTTPException(503, str(exc)) from exc
        return JSONResponse({"ledger": reader.description, "ledger_warning": reader.warning, "pipelines": [
            {"pipeline_id": p.pipeline_id, "dag_ids": sorted(p.dag_ids), "epoch": p.epoch, "counts": p.counts}
            for p in pipelines]})

    @app.get("/api/pipelines/{pipeline_id}")
    def get_pipeline(pipeline_id: str, user: GetUserDep, session: SessionDep) -> JSONResponse:
        now = datetime.now(timezone.utc)
        try:
            reader = _reader()
            pipelines = visible(reader, user, session)
            report = reader.report(pipeline_id, now=now) if pipeline_id in {p.pipeline_id for p in pipelines} else None
        except LedgerUnavailable as exc:
            raise HTTPException(503, str(exc)) from exc
        if report is None:  # unknown and not permitted look the same: the page does not tell which exist
            raise HTTPException(404, f"no pipeline {pipeline_id!r} that you may see")
        report.dag_ids = next(p.dag_ids for p in pipelines if p.pipeline_id == pipeline_id)
        return JSONResponse(jsonable_encoder(report_json(report, read_lag(report, kafka_timeout_ms()),
                                                         read_drift(reader, report, session, kafka_timeout_ms()))))

    return app
