"""The CLI's commands that change a pipeline or the ledger (each only prints its plan unless --execute): mirror the
committed positions to the consumer group, rewind, prune; and the ledger's schema version (db)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from airflow_exactly_once.cli.connections import kafka_settings
from airflow_exactly_once.cli.reading import known
from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.retention import Retention, prune
from airflow_exactly_once.core.rewind import apply_rewind, plan_rewind
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.core.timestamps import iso, to_epoch_ms
from airflow_exactly_once.kafka.consumer_group import mirror_committed_offsets
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.sinks import pipeline_committer
from airflow_exactly_once.sinks.commands import CommandTools

_DEFAULT = object()  # --keep-batches / --keep-days not given: the pipeline's own setting


def add_commands(commands: Any, tools: CommandTools) -> None:
    mirror = tools.command(commands, "mirror", cmd_mirror, "copy the ledger's committed positions to the pipeline's "
                                                           "mirror_consumer_group (repairs a group that drifted)",
                           asks_kafka=True)
    mirror.add_argument("--execute", action="store_true", help="write the offsets (without: only print them)")

    rewind = tools.command(commands, "rewind", cmd_rewind, "move a continuation pipeline back so a range is "
                                                           "processed again", asks_kafka=True)
    target = rewind.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-time", help="first record time to process again (ISO-8601 or epoch ms)")
    target.add_argument("--to-offsets", nargs="+", metavar="TOPIC:PARTITION=OFFSET")
    rewind.add_argument("--output", choices=["retract", "keep"], default="retract",
                        help="retract: withdraw the committed output of the rewound batches (exactly once); "
                             "keep: leave it, the range is delivered again")
    rewind.add_argument("--reason", default="", help="recorded in the ledger with the rewind")
    rewind.add_argument("--execute", action="store_true", help="apply it (without: only print the plan)")

    pruning = tools.command(commands, "prune", cmd_prune, "remove old final batches, keeping the committed floor "
                                                          "(retention)")
    pruning.add_argument("--keep-batches", type=_count_or_none, metavar="N|none", default=_DEFAULT,
                         help="keep at least the newest N batches (default: the pipeline's retention_batches)")
    pruning.add_argument("--keep-days", type=_days_or_none, metavar="D|none", default=_DEFAULT,
                         help="keep at least the batches of the last D days (default: the pipeline's "
                              "retention_days)")
    pruning.add_argument("--execute", action="store_true", help="prune (without: only print what would go)")

    db = commands.add_parser("db", help="the ledger's schema version: show it, upgrade it")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    for name, handler, help_text in (
            ("upgrade", cmd_db_upgrade, "upgrade the ledger's schema to this provider's version (creates an empty "
                                        "one); writers also do this on first use unless "
                                        "AIRFLOW_EXACTLY_ONCE_LEDGER_AUTO_UPGRADE=false"),
            ("current", cmd_db_current, "the ledger's schema revision and the newest this provider knows"),
            ("version", cmd_db_current, "the same as `db current`")):
        db_commands.add_parser(name, help=help_text, parents=[tools.common]).set_defaults(handler=handler,
                                                                                         access="db")


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


# -- mirroring -----------------------------------------------------------------------


def cmd_mirror(ledger: Ledger, args: argparse.Namespace) -> int:
    pid = known(ledger, args.pipeline)
    stored = ledger.stored_config(pid)
    if not stored.get("mirror_consumer_group"):
        raise ConfigurationError(f"{pid} has no mirror_consumer_group: there is no consumer group to mirror to")
    config = PipelineConfig.from_dict(stored)
    settings = kafka_settings(config, args)
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

    pid = known(ledger, args.pipeline)
    config = PipelineConfig.from_dict(ledger.stored_config(pid))
    positions = ledger.committed_positions(pid)
    tps = sorted(positions)
    source = KafkaOffsetSource(kafka_settings(config, args))
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
    pid = known(ledger, args.pipeline)
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
