"""The CLI's reading commands: pipelines, batches, show, positions, events, and check (the tiling audit and the
drift of the mirrored consumer group and of Airflow's Asset events)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from datetime import datetime
from typing import Any

from airflow_exactly_once.cli.connections import kafka_settings
from airflow_exactly_once.cli.output import batch_dict, dash, print_rows, time_text
from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.lineage_names import pipeline_asset_uri
from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.timestamps import iso
from airflow_exactly_once.kafka.consumer_group import read_group_offsets
from airflow_exactly_once.observe.audit import audit_pipeline
from airflow_exactly_once.observe.drift import DriftReport, check_drift, mirror_command
from airflow_exactly_once.sinks.commands import CommandTools

GROUP, ASSET_EVENTS = "consumer-group", "asset-events"  # what `check --without` can leave out


def add_commands(commands: Any, tools: CommandTools) -> None:
    pipelines = commands.add_parser("pipelines", help="list the pipelines in the ledger", parents=[tools.common])
    pipelines.set_defaults(handler=cmd_pipelines)
    batches = tools.command(commands, "batches", cmd_batches,
                            "list a pipeline's batches, newest first")
    batches.add_argument("--state", action="append", choices=[s.value for s in BatchState])
    batches.add_argument("--limit", type=int, default=50)
    tools.command(commands, "show", cmd_show, "one batch: ranges, state, handles, counts, events",
                  pipeline_help="pipeline id, or '<pipeline>:<seq>'").add_argument("seq", nargs="?", type=int)
    tools.command(commands, "positions", cmd_positions,
                  "where each partition's next batch starts")
    tools.command(commands, "events", cmd_events,
                  "the pipeline's audit trail (skips, no-ops, rewinds)").add_argument("--limit", type=int, default=50)
    check = tools.command(commands, "check", cmd_check,
                          "verify that committed ranges tile each partition, and that the mirrored consumer group "
                          "and Airflow's Asset events agree with the ledger (exit 1 if not)", asks_kafka=True)
    check.add_argument("--without", action="append", choices=[GROUP, ASSET_EVENTS], default=[],
                       help="leave one comparison out (asset-events needs Airflow's metadata database)")


def known(ledger: Ledger, pipeline_id: str) -> str:
    ledger.stored_config(pipeline_id)  # raises for a pipeline the ledger does not have
    return pipeline_id


def cmd_pipelines(ledger: Ledger, args: argparse.Namespace) -> int:
    rows = []
    for pipeline in ledger.list_pipelines():
        pid = pipeline["pipeline_id"]
        config = json.loads(pipeline["config"])
        counts = ledger.state_counts(pid)
        last = next(iter(ledger.list_batches(pid, [BatchState.COMMITTED], limit=1)), None)
        rows.append({"pipeline": pid, "mode": config.get("range_mode", "continuation"),
                     "topics": ",".join(config.get("topics") or []) or f"pattern {config.get('topic_pattern')}",
                     "epoch": pipeline["epoch"],
                     "batches": " ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "-",
                     "last_committed": last.seq if last else "-", "updated": time_text(pipeline["updated_at"])})
    print_rows(args, rows)
    return 0


def cmd_batches(ledger: Ledger, args: argparse.Namespace) -> int:
    states = [BatchState(s) for s in args.state] if args.state else None
    rows = []
    found = ledger.list_batches(known(ledger, args.pipeline), states, limit=args.limit)
    intervals = ledger.batch_intervals(args.pipeline, [b.seq for b in found])
    for batch in found:
        interval = intervals.get(batch.seq)
        rows.append({"seq": batch.seq, "state": batch.state.value, "run_id": batch.run_id,
                     "interval": f"{iso(interval[0])}..{iso(interval[1])}" if interval else "-",
                     "offsets": batch.offset_span, "in": dash(batch.input_records),
                     "out": dash(batch.output_records), "bad": dash(batch.bad_records and batch.bad_records.count),
                     "updated": time_text(batch.updated_at)})
    print_rows(args, rows)
    return 0


def cmd_show(ledger: Ledger, args: argparse.Namespace) -> int:
    batch_id = BatchId(args.pipeline, args.seq) if args.seq is not None else BatchId.parse(args.pipeline)
    known(ledger, batch_id.pipeline_id)
    floor = ledger.retention_floor(batch_id.pipeline_id)
    if batch_id.seq <= floor.batch_seq:
        raise ConfigurationError(f"batch {batch_id} was pruned by retention (batches up to {floor.batch_seq} are gone; "
                                 f"`positions` and `check` start from the committed floor they left)")
    batch = ledger.get_batch(batch_id)
    interval = ledger.batch_interval(batch_id)
    events = [e for e in ledger.list_events(batch_id.pipeline_id, limit=10_000) if e["batch_seq"] == batch_id.seq]
    data = batch_dict(batch, interval)
    data["events"] = [{"at": time_text(e["at"]), "kind": e["kind"], "message": e["message"]} for e in reversed(events)]
    if args.json:
        print(json.dumps(data, indent=1, default=str))
        return 0
    print(f"batch {batch.id}  {batch.state.value}  (epoch {batch.epoch})")
    print(f"run:      {batch.run_id}")
    if interval:
        print(f"interval: {iso(interval[0])} .. {iso(interval[1])}")
    print(f"created:  {time_text(batch.created_at)}   updated: {time_text(batch.updated_at)}")
    print(f"records:  {dash(batch.input_records)} read, {dash(batch.output_records)} written"
          + (f", {bad.count} bad ({bad.policy})" if (bad := batch.bad_records) else ""))
    print(f"topics:   {', '.join(data['topics']) or '-'}")
    print("ranges:")
    for r in batch.ranges:
        print(f"  {r.topic}[{r.partition}]  {r.start}..{r.end}  ({r.size} offsets)")
    print(f"handles:  {json.dumps(batch.handles, indent=1, default=str) if batch.handles else '-'}")
    if batch.details:
        print(f"details:  {json.dumps(batch.details, default=str)}")
    if batch.error:
        print(f"error:    {batch.error}")
    for event in data["events"]:
        print(f"event:    {event['at']}  {event['kind']}: {event['message']}")
    return 0


def cmd_positions(ledger: Ledger, args: argparse.Namespace) -> int:
    pid = known(ledger, args.pipeline)
    starts = ledger.partition_starts(pid)
    rows = [{"topic": t, "partition": p, "position": offset, "initial": starts.get((t, p), ("-",))[0],
             "started_by": starts.get((t, p), ("-", "-"))[1]}
            for (t, p), offset in sorted(ledger.committed_positions(pid).items())]
    print_rows(args, rows)
    return 0


def cmd_events(ledger: Ledger, args: argparse.Namespace) -> int:
    rows = [{"at": time_text(e["at"]), "batch": dash(e["batch_seq"]), "kind": e["kind"], "message": e["message"]}
            for e in ledger.list_events(known(ledger, args.pipeline), limit=args.limit)]
    print_rows(args, rows)
    return 0


def cmd_check(ledger: Ledger, args: argparse.Namespace) -> int:
    pid = known(ledger, args.pipeline)
    report = audit_pipeline(ledger, pid)
    drift = _drift(ledger, pid, args)
    if args.json:
        print(json.dumps({**report.__dict__, "drift_ok": drift.ok, "compared": drift.compared,
                          "findings": [dataclasses.asdict(f) for f in drift.findings]}, indent=1))
    else:
        verdict = "OK" if report.ok else f"{len(report.problems)} PROBLEM(S)"
        print(f"{report.pipeline_id}: {report.committed_batches} committed batches; tiling {verdict}")
        for note in report.notes:
            print(f"  recorded: {note}")
        for problem in report.problems:
            print(f"  PROBLEM: {problem}")
        print(f"drift {'OK' if drift.ok else f'{len(drift.drift)} DIFFERENCE(S)'}: compared with "
              + "; ".join(drift.compared))
        for finding in drift.findings:
            print(f"  {finding.describe()}")
    return 0 if report.ok and drift.ok else 1


def _drift(ledger: Ledger, pid: str, args: argparse.Namespace) -> DriftReport:
    """The ledger against the mirrored consumer group and Airflow's Asset events (observe/drift.py)."""
    def read_group(group: str) -> dict:
        return read_group_offsets(kafka_settings(PipelineConfig.from_dict(ledger.stored_config(pid)), args),
                                  group)

    def read_events(since: datetime | None) -> list:
        # Airflow's database only when read
        from airflow_exactly_once.airflow_integration.asset_history import recorded_batch_events

        return recorded_batch_events(pid, since=since)

    return check_drift(ledger, pid, read_group=None if GROUP in args.without else read_group,
                       read_events=None if ASSET_EVENTS in args.without else read_events,
                       asset_uri=pipeline_asset_uri(pid), mirror_command=repair_command(pid, args))


def repair_command(pipeline_id: str, args: argparse.Namespace) -> str:
    """The mirror command that repairs a drifted group, with the Kafka options this check was given."""
    return mirror_command(pipeline_id, (f" --kafka-conn-id {args.kafka_conn_id}" if args.kafka_conn_id else "") + (
        f" --bootstrap-servers {args.bootstrap_servers}" if args.bootstrap_servers else ""))
