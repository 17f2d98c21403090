"""`airflow-exactly-once`: look into the offset ledger, check it, mirror, rewind or prune a pipeline.

    airflow-exactly-once pipelines
    airflow-exactly-once batches PIPELINE [--state COMMITTED] [--limit 20]
    airflow-exactly-once show PIPELINE SEQ
    airflow-exactly-once positions PIPELINE
    airflow-exactly-once events PIPELINE
    airflow-exactly-once check PIPELINE [--without consumer-group|asset-events] [--kafka-conn-id ID]
    airflow-exactly-once mirror PIPELINE [--kafka-conn-id ID] [--execute]
    airflow-exactly-once rewind PIPELINE --to-time 2024-05-01T00:00Z [--output retract|keep] [--execute]
    airflow-exactly-once rewind PIPELINE --to-offsets orders:0=100 orders:1=90 [--execute]
    airflow-exactly-once prune PIPELINE [--keep-batches N] [--keep-days D] [--execute]
    airflow-exactly-once transactions list PIPELINE [--kafka-conn-id ID] [--bootstrap-servers HOSTS]
    airflow-exactly-once transactions abort PIPELINE [--id TRANSACTIONAL_ID] [--force]
    airflow-exactly-once db upgrade
    airflow-exactly-once db current
    airflow-exactly-once db version

The ledger is --ledger-url, or the Airflow connection --ledger-conn-id, or
$AIRFLOW_EXACTLY_ONCE_LEDGER_URL, or the embedded SQLite file in $AIRFLOW_HOME (stderr says
which, without its password); these options and --json go before or after the command.
`rewind`, `prune` and `mirror` only print what they would do unless --execute is given.
`transactions list|abort` also work without a ledger (a lost one): --prefix PREFIX with
--bootstrap-servers or --kafka-conn-id (and --topic for hanging transactions) instead of PIPELINE.
Reading commands never change the ledger's schema: a ledger older than this code asks for
`db upgrade`, which brings it to this code's version (`db current` shows where it stands).
On Airflow >= 3.2 the same commands are `airflow exactly-once ...`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from datetime import datetime
from typing import Any, Iterator, Sequence

from kafka.errors import KafkaError

from airflow_exactly_once.observe.audit import audit_pipeline
from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.observe.drift import DriftReport, check_drift, mirror_command
from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError, SinkError
from airflow_exactly_once.core.ledger import Ledger, missing_sqlite_file, redacted_url
from airflow_exactly_once.core.lineage_names import pipeline_asset_uri
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.retention import Retention, prune
from airflow_exactly_once.core.rewind import apply_rewind, plan_rewind
from airflow_exactly_once.core.secrets import REDACTED
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.timestamps import iso, to_epoch_ms
from airflow_exactly_once.core.topics import topics_of
from airflow_exactly_once.kafka.access import explain_failure
from airflow_exactly_once.kafka.consumer_group import mirror_committed_offsets, read_group_offsets
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks import pipeline_committer
from airflow_exactly_once.sinks.kafka import lingering, probe
from airflow_exactly_once.sinks.kafka.live_cluster import LiveCluster
from airflow_exactly_once.sinks.kafka.sink_committer import KafkaSinkCommitter
from airflow_exactly_once.sinks.kafka.transactional_ids import IdNaming

LEDGER_URL_ENV = "AIRFLOW_EXACTLY_ONCE_LEDGER_URL"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if getattr(args, "prefix", None):  # `transactions` for a lost ledger: Kafka only
            return args.handler(None, args)
        url = _ledger_url(args)
        access = "write" if getattr(args, "execute", False) else args.access
        # Readers never migrate, nor create tables, nor a SQLite file that does not exist yet.
        ledger = None if access == "read" and missing_sqlite_file(url) else Ledger(url)
        if ledger is not None and access == "write":  # a writer always has one (not missing_sqlite_file)
            ledger.create_schema()  # a writer upgrades on first use, like a batch does
        elif access == "read" and (ledger is None or not ledger.has_schema()):
            if args.command == "pipelines":
                _print(args, [])
                return 0
            raise ConfigurationError(f"the ledger {ledger.engine.url if ledger else url} holds no tables yet: no "
                                     "pipeline has run there")
        return args.handler(ledger, args)
    except ExactlyOnceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def airflow_command(args: argparse.Namespace) -> None:
    """`airflow exactly-once [OPTIONS] COMMAND ...` (cli/definition.py): the same parser and output."""
    argv = [*(["--ledger-url", args.ledger_url] if args.ledger_url else []),
            *(["--ledger-conn-id", args.ledger_conn_id] if args.ledger_conn_id else []),
            *(["--json"] if args.json else []), *args.argv]
    code = main(argv)
    if code:
        raise SystemExit(code)


def _global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """Where the ledger is, and the output format: before the command, or (suppress=True) after it."""
    default: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--ledger-url", help="SQLAlchemy URL of the ledger, e.g. postgresql+psycopg2://u@h/db",
                       **default)
    where.add_argument("--ledger-conn-id", help="an Airflow connection (exactly_once_ledger, postgres or sqlite) "
                                                "holding the ledger", **default)
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables", **default)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="airflow-exactly-once", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True)
    parser.set_defaults(access="read")

    pipelines = sub.add_parser("pipelines", help="list the pipelines in the ledger")
    pipelines.set_defaults(handler=cmd_pipelines)
    _global_options(pipelines, suppress=True)

    def command(name: str, handler, help_text: str) -> argparse.ArgumentParser:
        """A subcommand about one pipeline."""
        parser = sub.add_parser(name, help=help_text)
        _global_options(parser, suppress=True)
        parser.add_argument("pipeline", help="pipeline id" + (", or '<pipeline>:<seq>'" if name == "show" else ""))
        parser.set_defaults(handler=handler)
        return parser

    batches = command("batches", cmd_batches, "list a pipeline's batches, newest first")
    batches.add_argument("--state", action="append", choices=[s.value for s in BatchState])
    batches.add_argument("--limit", type=int, default=50)
    command("show", cmd_show, "one batch: ranges, state, handles, counts, events").add_argument(
        "seq", nargs="?", type=int)
    command("positions", cmd_positions, "where each partition's next batch starts")
    command("events", cmd_events, "the pipeline's audit trail (skips, no-ops, rewinds)").add_argument(
        "--limit", type=int, default=50)
    check = command("check", cmd_check, "verify that committed ranges tile each partition, and that the mirrored "
                                        "consumer group and Airflow's Asset events agree with the ledger (exit 1 "
                                        "if not)")
    check.add_argument("--without", action="append", choices=[GROUP, ASSET_EVENTS], default=[],
                       help="leave one comparison out (asset-events needs Airflow's metadata database)")
    _kafka_options(check)

    mirror = command("mirror", cmd_mirror, "copy the ledger's committed positions to the pipeline's "
                                           "mirror_consumer_group (repairs a group that drifted)")
    _kafka_options(mirror)
    mirror.add_argument("--execute", action="store_true", help="write the offsets (without: only print them)")

    rewind = command("rewind", cmd_rewind, "move a continuation pipeline back so a range is processed again")
    target = rewind.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-time", help="first record time to process again (ISO-8601 or epoch ms)")
    target.add_argument("--to-offsets", nargs="+", metavar="TOPIC:PARTITION=OFFSET")
    rewind.add_argument("--output", choices=["retract", "keep"], default="retract",
                        help="retract: withdraw the committed output of the rewound batches (exactly once); "
                             "keep: leave it, the range is delivered again")
    rewind.add_argument("--reason", default="", help="recorded in the ledger with the rewind")
    _kafka_options(rewind)
    rewind.add_argument("--execute", action="store_true", help="apply it (without: only print the plan)")

    pruning = command("prune", cmd_prune, "remove old final batches, keeping the committed floor (retention)")
    pruning.add_argument("--keep-batches", type=_count_or_none, metavar="N|none", default=_DEFAULT,
                         help="keep at least the newest N batches (default: the pipeline's retention_batches)")
    pruning.add_argument("--keep-days", type=_days_or_none, metavar="D|none", default=_DEFAULT,
                         help="keep at least the batches of the last D days (default: the pipeline's "
                              "retention_days)")
    pruning.add_argument("--execute", action="store_true", help="prune (without: only print what would go)")

    transactions = sub.add_parser("transactions", help="the Kafka transactions of a pipeline's sink that are open "
                                                       "or hanging: list them, end them")
    transactions_sub = transactions.add_subparsers(dest="transactions_command", required=True)
    for txn_command, txn_handler, txn_help in (
            ("list", cmd_transactions_list, "open transactions of the pipeline's transactional ids (age, producer "
                                            "id, epoch, ledger batch) and hanging ones of its output (exit 1 if "
                                            "any)"),
            ("abort", cmd_transactions_abort, "end them: fence open ones, abort markers for hanging ones; a "
                                              "PREPARED batch's only with --force (exit 3: some refused, 4: "
                                              "some outcome unknown)")):
        txn_parser = transactions_sub.add_parser(txn_command, help=txn_help)
        _global_options(txn_parser, suppress=True)
        txn_parser.add_argument("pipeline", nargs="?", help="pipeline id (omit it with --prefix)")
        txn_parser.add_argument("--prefix", help="without a ledger: the transactional id prefix to look for (the "
                                                 "sink's transactional_id_prefix, else the pipeline id)")
        txn_parser.add_argument("--topic", action="append", default=[],
                                help="without a ledger: an output topic to search for hanging transactions")
        _kafka_options(txn_parser)
        txn_parser.set_defaults(handler=txn_handler)
        if txn_command == "abort":
            txn_parser.add_argument("--id", dest="transactional_id", help="only this transactional id")
            txn_parser.add_argument("--force", action="store_true",
                                    help="also abort transactions of PREPARED batches (the batch is then lost and "
                                         "processed again) and, without a ledger, hanging ones")

    db = sub.add_parser("db", help="the ledger's schema version: show it, upgrade it")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    for name, handler, help_text in (
            ("upgrade", cmd_db_upgrade, "upgrade the ledger's schema to this provider's version (creates an empty "
                                        "one); writers also do this on first use unless "
                                        "AIRFLOW_EXACTLY_ONCE_LEDGER_AUTO_UPGRADE=false"),
            ("current", cmd_db_current, "the ledger's schema revision and the newest this provider knows"),
            ("version", cmd_db_current, "the same as `db current`")):
        db_parser = db_sub.add_parser(name, help=help_text)
        _global_options(db_parser, suppress=True)
        db_parser.set_defaults(handler=handler, access="db")
    return parser


_DEFAULT = object()  # --keep-batches / --keep-days not given: the pipeline's own setting
GROUP, ASSET_EVENTS = "consumer-group", "asset-events"  # what `check --without` can leave out


def _kafka_options(parser: argparse.ArgumentParser) -> None:
    """Which Kafka a command asks, when it is not the one the ledger stored (or its secrets are needed)."""
    parser.add_argument("--bootstrap-servers", help="Kafka to ask (default: the pipeline's own)")
    parser.add_argument("--kafka-conn-id", help="the kafka connection to ask with (needed when the pipeline's "
                                                "Kafka settings hold secrets, which the ledger does not store)")


def _count_or_none(text: str) -> int | None:
    if text.lower() == "none":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of batches (1 or more), or none")
    return int(text)


def _days_or_none(text: str) -> float | None:
    if text.lower() == "none":
        return None
    try:
        days = float(text)
    except ValueError:
        days = 0.0
    if days <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of days above 0 (e.g. 7 or 0.5), or none")
    return days


def _ledger_url(args: argparse.Namespace) -> str:
    """The ledger's URL; says on stderr which ledger it is (without its password), and when it is the embedded file
    that the pipelines' tasks refuse (their executor may run them on other machines, each with its own file)."""
    if args.ledger_url:
        return _reading(args.ledger_url, "--ledger-url")
    if args.ledger_conn_id or not os.environ.get(LEDGER_URL_ENV):
        from airflow_exactly_once.hooks.ledger import (
            LedgerHook,  # Airflow only when asked for
        )

        hook = LedgerHook(ledger_conn_id=args.ledger_conn_id)
        print(f"ledger: {hook.describe()}", file=sys.stderr)
        problem = hook.placement_problem()
        if problem:
            print(f"warning: this may not be the pipelines' ledger: their tasks refuse it: {problem} Read theirs "
                  f"with --ledger-conn-id or --ledger-url.", file=sys.stderr)
        return hook.get_url()
    return _reading(os.environ[LEDGER_URL_ENV], f"${LEDGER_URL_ENV}")


def _reading(url: str, origin: str) -> str:
    print(f"ledger: {redacted_url(url)} ({origin})", file=sys.stderr)
    return url


def _kafka_settings(config: PipelineConfig | None, args: argparse.Namespace) -> KafkaSettings:
    """The pipeline's Kafka settings from the ledger (its secrets from the kafka connection its tasks used, as the
    ledger page takes them), or from --kafka-conn-id; --bootstrap-servers on top (alone without a pipeline)."""

    if args.kafka_conn_id:
        from airflow_exactly_once.hooks.kafka import (
            connection_kafka_settings,  # Airflow only when asked for
        )

        settings = connection_kafka_settings(args.kafka_conn_id)
    elif config is None:
        settings = KafkaSettings("")
    else:
        settings = KafkaSettings.of(config)
        if REDACTED in settings.properties.values():
            from airflow_exactly_once.hooks.kafka import (
                stored_pipeline_kafka_settings,  # Airflow only when the secrets are needed
            )

            settings = stored_pipeline_kafka_settings(config)
    if args.bootstrap_servers:
        settings = dataclasses.replace(settings, bootstrap_servers=args.bootstrap_servers,
                                       origin="--bootstrap-servers")
    return settings


# -- reading -------------------------------------------------------------------------


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
                     "last_committed": last.seq if last else "-", "updated": _time(pipeline["updated_at"])})
    _print(args, rows)
    return 0


def cmd_batches(ledger: Ledger, args: argparse.Namespace) -> int:
    states = [BatchState(s) for s in args.state] if args.state else None
    rows = []
    found = ledger.list_batches(_known(ledger, args.pipeline), states, limit=args.limit)
    intervals = ledger.batch_intervals(args.pipeline, [b.seq for b in found])
    for batch in found:
        interval = intervals.get(batch.seq)
        rows.append({"seq": batch.seq, "state": batch.state.value, "run_id": batch.run_id,
                     "interval": f"{iso(interval[0])}..{iso(interval[1])}" if interval else "-",
                     "offsets": batch.offset_span, "in": _dash(batch.input_records),
                     "out": _dash(batch.output_records), "bad": _dash(batch.bad_records.count if batch.bad_records else None),
                     "updated": _time(batch.updated_at)})
    _print(args, rows)
    return 0


def cmd_show(ledger: Ledger, args: argparse.Namespace) -> int:
    batch_id = BatchId(args.pipeline, args.seq) if args.seq is not None else BatchId.parse(args.pipeline)
    _known(ledger, batch_id.pipeline_id)
    floor = ledger.retention_floor(batch_id.pipeline_id)
    if batch_id.seq <= floor.batch_seq:
        raise ConfigurationError(f"batch {batch_id} was pruned by retention (batches up to {floor.batch_seq} are gone; "
                                 f"`positions` and `check` start from the committed floor they left)")
    batch = ledger.get_batch(batch_id)
    interval = ledger.batch_interval(batch_id)
    events = [e for e in ledger.list_events(batch_id.pipeline_id, limit=10_000) if e["batch_seq"] == batch_id.seq]
    data = _batch_dict(batch, interval)
    data["events"] = [{"at": _time(e["at"]), "kind": e["kind"], "message": e["message"]} for e in reversed(events)]
    if args.json:
        print(json.dumps(data, indent=1, default=str))
        return 0
    print(f"batch {batch.id}  {batch.state.value}  (epoch {batch.epoch})")
    print(f"run:      {batch.run_id}")
    if interval:
        print(f"interval: {iso(interval[0])} .. {iso(interval[1])}")
    print(f"created:  {_time(batch.created_at)}   updated: {_time(batch.updated_at)}")
    print(f"records:  {_dash(batch.input_records)} read, {_dash(batch.output_records)} written"
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
    pid = _known(ledger, args.pipeline)
    starts = ledger.partition_starts(pid)
    rows = [{"topic": t, "partition": p, "position": offset, "initial": starts.get((t, p), ("-",))[0],
             "started_by": starts.get((t, p), ("-", "-"))[1]}
            for (t, p), offset in sorted(ledger.committed_positions(pid).items())]
    _print(args, rows)
    return 0


def cmd_events(ledger: Ledger, args: argparse.Namespace) -> int:
    rows = [{"at": _time(e["at"]), "batch": _dash(e["batch_seq"]), "kind": e["kind"], "message": e["message"]}
            for e in ledger.list_events(_known(ledger, args.pipeline), limit=args.limit)]
    _print(args, rows)
    return 0


def cmd_check(ledger: Ledger, args: argparse.Namespace) -> int:
    pid = _known(ledger, args.pipeline)
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
        return read_group_offsets(_kafka_settings(PipelineConfig.from_dict(ledger.stored_config(pid)), args),
                                  group)

    def read_events(since: datetime | None) -> list:
        # Airflow's database only when read
        from airflow_exactly_once.airflow_integration.asset_history import recorded_batch_events

        return recorded_batch_events(pid, since=since)

    return check_drift(ledger, pid, read_group=None if GROUP in args.without else read_group,
                       read_events=None if ASSET_EVENTS in args.without else read_events,
                       asset_uri=pipeline_asset_uri(pid), mirror_command=_mirror_command(pid, args))


def _mirror_command(pipeline_id: str, args: argparse.Namespace) -> str:
    """The repair command, with the Kafka options this check was given."""
    return mirror_command(pipeline_id, (f" --kafka-conn-id {args.kafka_conn_id}" if args.kafka_conn_id else "") + (
        f" --bootstrap-servers {args.bootstrap_servers}" if args.bootstrap_servers else ""))


def cmd_mirror(ledger: Ledger, args: argparse.Namespace) -> int:
    pid = _known(ledger, args.pipeline)
    stored = ledger.stored_config(pid)
    if not stored.get("mirror_consumer_group"):
        raise ConfigurationError(f"{pid} has no mirror_consumer_group: there is no consumer group to mirror to")
    config = PipelineConfig.from_dict(stored)
    settings = _kafka_settings(config, args)
    if not args.execute:
        for (topic, partition), offset in sorted(ledger.committed_positions(pid).items()):
            print(f"{config.mirror_consumer_group}: {topic}[{partition}] -> {offset}")
        print("dry run: nothing changed; add --execute to write these offsets")
        return 0
    mirrored = mirror_committed_offsets(config, ledger, settings=settings)
    print(mirrored.message)
    return 0 if mirrored.ok else 1


# -- rewinding -----------------------------------------------------------------------


def _stored_sink(config: PipelineConfig, output: str) -> SinkCommitter:
    """The pipeline's sink's committer as the ledger stored it; retracting output needs secrets the ledger does not keep."""
    hidden = [".".join(path) for path in config.redacted_paths() if path[0] in ("sink", "dead_letter")]
    if hidden and output == "retract":
        raise ConfigurationError(f"retracting {config.pipeline_id}'s output needs its sink's secrets "
                                 f"({', '.join(hidden)}), which the ledger does not store: give the sink a "
                                 "connection (conn_id) instead of the secret, or rewind with --output keep")
    return pipeline_committer(config)


def cmd_rewind(ledger: Ledger, args: argparse.Namespace) -> int:

    pid = _known(ledger, args.pipeline)
    config = PipelineConfig.from_dict(ledger.stored_config(pid))
    positions = ledger.committed_positions(pid)
    tps = sorted(positions)
    source = KafkaOffsetSource(_kafka_settings(config, args))
    try:
        log_starts = source.log_start_offsets(tps)
        if args.to_time:
            at = to_epoch_ms(args.to_time, "--to-time")
            found = source.offsets_for_times(tps, at)
            # No record at or after the time: that partition has nothing to process again.
            targets = {tp: min(offset, positions[tp]) for tp, offset in found.items() if offset is not None}
            what = f"rewind to time {iso(at)}"
        else:
            targets = _parse_offsets(args.to_offsets)
            what = "rewind to offsets " + ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(targets.items()))
    finally:
        source.close()
    if not targets:
        raise ConfigurationError(f"no partition of {pid} has records at or after {args.to_time}: nothing to rewind")
    plan = plan_rewind(ledger, pid, targets, args.output, log_starts)
    reason = what + (f": {args.reason}" if args.reason else "")
    done: list[str] = []
    if args.execute:
        done = apply_rewind(ledger, _stored_sink(config, args.output), plan, reason)
    if args.json:
        print(json.dumps({"pipeline": pid, "executed": args.execute, "reason": reason,
                          "moves": {f"{t}:{p}": list(m) for (t, p), m in plan.moves.items()},
                          "retracted": [b.seq for b in plan.retract], "done": done}, indent=1))
        return 0
    print(f"{pid}: {reason}")
    for line in plan.describe():
        print(f"  {line}")
    if args.execute:
        for line in done:
            print(f"  done: {line}")
        print("rewound: the next runs process the range again")
    else:
        print("dry run: nothing changed; add --execute to apply")
    return 0


# -- retention -----------------------------------------------------------------------


def cmd_prune(ledger: Ledger, args: argparse.Namespace) -> int:
    pid = _known(ledger, args.pipeline)
    stored = Retention.stored(ledger.stored_config(pid))
    retention = Retention(stored.keep_batches if args.keep_batches is _DEFAULT else args.keep_batches,
                          stored.keep_days if args.keep_days is _DEFAULT else args.keep_days)
    report = prune(ledger, pid, retention, dry_run=not args.execute)
    if args.json:
        print(json.dumps({"pipeline": pid, "executed": args.execute, "keep_batches": retention.keep_batches,
                          "keep_days": retention.keep_days, "floor_before": report.floor_before,
                          **dataclasses.asdict(report.pruned)}, indent=1))
        return 0
    for line in report.describe():
        print(line)
    if not args.execute and report.pruned.batches:
        print("dry run: nothing changed; add --execute to prune")
    return 0


def _parse_offsets(items: list[str]) -> dict[tuple[str, int], int]:

    targets = {}
    for item in items:
        where, sep, offset = item.rpartition("=")
        topic, colon, partition = where.rpartition(":")
        if not sep or not colon or not topic or not partition.isdigit() or not offset.isdigit():
            raise ConfigurationError(f"--to-offsets {item!r}: write TOPIC:PARTITION=OFFSET, e.g. orders:0=1200")
        targets[(topic, int(partition))] = int(offset)
    return targets


# -- the schema version -------------------------------------------------------------


def cmd_db_upgrade(ledger: Ledger, args: argparse.Namespace) -> int:
    before, after = ledger.upgrade_schema()
    if args.json:
        print(json.dumps({"before": before.revision, "before_state": before.state, "after": after.revision,
                          "head": after.head}, indent=1))
    elif before.revision == after.revision:
        print(f"the ledger is already at {after.revision}, the newest this provider knows")
    else:
        print(f"upgraded the ledger from {before.revision or before.state} to {after.revision}")
    return 0


def cmd_db_current(ledger: Ledger, args: argparse.Namespace) -> int:
    version = ledger.schema_version()
    if args.json:
        print(json.dumps({"current": version.revision, "head": version.head, "state": version.state}, indent=1))
    else:
        print(f"ledger: {version.describe()}\nhead:   {version.head} (the newest this provider knows)")
    return 0 if version.state == "current" else 1  # 1: `db upgrade` has work to do (or the ledger is newer)


# -- Kafka transactions --------------------------------------------------------------

ABORT_REFUSED, ABORT_UNKNOWN = 3, 4  # `transactions abort`: some refused; some outcome unknown (beats refused)


def cmd_transactions_list(ledger: Ledger | None, args: argparse.Namespace) -> int:
    found = []
    for target, live in _transaction_targets(ledger, args):
        with _kafka_failure(target.settings, "listing the pipeline's Kafka transactions"):
            found.append((target, lingering.survey(live, target.naming, target.topics, target.record)))
    rows = [t.as_row() for _, survey in found for t in survey.open] + \
        [h.as_row() for _, survey in found for h in survey.hanging]
    _print(args, rows)
    for target, survey in found:
        for warning in survey.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        if not survey.scanned_topics:
            print(f"note: no topic searched for hanging transactions of ids {target.naming.prefix}-*: give --topic",
                  file=sys.stderr)
    return 1 if rows else 0


def cmd_transactions_abort(ledger: Ledger | None, args: argparse.Namespace) -> int:
    results: list[lingering.AbortResult] = []
    for target, live in _transaction_targets(ledger, args):
        with _kafka_failure(target.settings, "ending the pipeline's Kafka transactions"):
            survey = lingering.survey(live, target.naming, target.topics, target.record)
            results += lingering.end(survey, target.settings, live, target.naming, target.record,
                                     only=args.transactional_id, force=args.force,
                                     producer_config=target.producer_config,
                                     transaction_timeout_ms=target.transaction_timeout_ms)
    if args.transactional_id and not results:
        raise ConfigurationError(f"no open or hanging transaction {args.transactional_id!r} among the pipeline's "
                                 "(run `transactions list`)")
    _print(args, [r.as_row() for r in results])
    outcomes = {r.outcome for r in results}
    if lingering.Outcome.UNKNOWN in outcomes:
        return ABORT_UNKNOWN
    return ABORT_REFUSED if lingering.Outcome.REFUSED in outcomes else 0


@dataclasses.dataclass(frozen=True)
class _TransactionTarget:
    """One Kafka output of a pipeline (its sink, or its dead-letter topic) as `transactions` works on it."""

    naming: IdNaming
    topics: tuple[str, ...]
    settings: KafkaSettings
    record: lingering.PipelineRecord
    producer_config: dict[str, Any]
    transaction_timeout_ms: int


def _transaction_targets(ledger: Ledger | None, args: argparse.Namespace):
    """Each Kafka output with its cluster (sinks.kafka.live_cluster: a node that just died is asked around;
    the clients are closed after the caller's loop step)."""
    for target in _targets(ledger, args):
        with _kafka_failure(target.settings, "connecting to the pipeline's Kafka"):
            admin = probe.new_admin_client(target.settings)
        with contextlib.closing(admin):
            live = LiveCluster(target.settings, admin)
            try:
                yield target, live
            finally:
                live.close()


@contextlib.contextmanager
def _kafka_failure(settings: KafkaSettings, doing: str) -> Iterator[None]:
    """A Kafka client's error as the CLI's (exit 2, not 1 as an uncaught one, which `list` uses for "found some"),
    saying what to fix: a settings or ACL problem, or which server did not answer (kafka.access)."""
    try:
        yield
    except KafkaError as exc:
        raise explain_failure(settings, exc, doing, lambda message: SinkError(message, retriable=True)) from exc


def _targets(ledger: Ledger | None, args: argparse.Namespace) -> list[_TransactionTarget]:
    if ledger is None:  # --prefix: a lost ledger
        if not (args.bootstrap_servers or args.kafka_conn_id):
            raise ConfigurationError("--prefix needs the Kafka to ask: --bootstrap-servers HOSTS or "
                                     "--kafka-conn-id ID")
        settings = _kafka_settings(None, args)
        return [_TransactionTarget(IdNaming(args.prefix), tuple(args.topic), settings, lingering.PipelineRecord(),
                                   {}, 60_000)]
    if not args.pipeline:
        raise ConfigurationError("name the pipeline (transactions list PIPELINE), or give --prefix PREFIX and the "
                                 "Kafka to ask for a pipeline the ledger does not have")
    pid = _known(ledger, args.pipeline)
    config = PipelineConfig.from_dict(ledger.stored_config(pid))
    committer = pipeline_committer(config)
    batches = ledger.list_batches(pid)
    committer.bind(config, lambda: [(b, c) for b in batches if (c := committer.committable(b.handles)) is not None],
                   ledger)
    kafka_sides = [side for side in (committer, getattr(committer, "output", None), getattr(committer, "dead", None))
                   if isinstance(side, KafkaSinkCommitter)]
    if not kafka_sides:
        raise ConfigurationError(f"pipeline {pid!r} writes to a {committer.name} sink: only Kafka sinks have "
                                 "transactions to list")
    by_seq = {b.seq: b for b in batches}
    targets = []
    for side in kafka_sides:
        output = side.output
        own_cluster = "kafka_config" in output.spec or output.spec.get("bootstrap_servers")
        settings = output.client_settings() if own_cluster and not (args.kafka_conn_id or args.bootstrap_servers) \
            else _kafka_settings(config, args)
        record = lingering.PipelineRecord(side.sweep.owners(), by_seq)
        targets.append(_TransactionTarget(output.naming, (output.topic, *args.topic), settings, record,
                                          output.producer_config, output.transaction_timeout_ms))
    return targets


# -- helpers -------------------------------------------------------------------------


def _known(ledger: Ledger, pipeline_id: str) -> str:
    ledger.stored_config(pipeline_id)  # raises for a pipeline the ledger does not have
    return pipeline_id


def _batch_dict(batch: Batch, interval: tuple[int, int] | None) -> dict[str, Any]:
    return {"pipeline_id": batch.pipeline_id, "seq": batch.seq, "state": batch.state.value, "run_id": batch.run_id,
            "epoch": batch.epoch, "interval": [iso(interval[0]), iso(interval[1])] if interval else None,
            "topics": topics_of((r.topic, r.partition) for r in batch.ranges),
            "ranges": [r.as_dict() for r in batch.ranges],
            "input_records": batch.input_records, "output_records": batch.output_records,
            "handles": batch.handles, "details": batch.details, "error": batch.error,
            "created_at": _time(batch.created_at), "updated_at": _time(batch.updated_at)}



def _time(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if hasattr(value, "strftime") else _dash(value)


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _print(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return
    if not rows:
        print("(none)")
        return
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip())
    for row in rows:
        print("  ".join(str(row[c]).ljust(widths[c]) for c in columns).rstrip())


if __name__ == "__main__":
    sys.exit(main())
