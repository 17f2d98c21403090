"""The Kafka sink's own CLI commands: `transactions list` and `transactions abort`, the open or hanging Kafka
transactions of a pipeline's sink (and of its dead-letter topic), found and ended through sinks.kafka.lingering.

Added to the `airflow-exactly-once` CLI through the sink's declaration (`KafkaSpec.commands`); they also work without
a ledger (a lost one): --prefix PREFIX with the Kafka to ask, instead of PIPELINE.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from typing import Any, Iterator

from kafka.errors import KafkaError

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError, SinkError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.kafka.access import explain_failure
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks.commands import CommandTools
from airflow_exactly_once.sinks.kafka import lingering, probe
from airflow_exactly_once.sinks.kafka.live_cluster import LiveCluster
from airflow_exactly_once.sinks.kafka.sink_committer import KafkaSinkCommitter
from airflow_exactly_once.sinks.kafka.transactional_ids import IdNaming

ABORT_REFUSED, ABORT_UNKNOWN = 3, 4  # `transactions abort`: some refused; some outcome unknown (beats refused)


def add_commands(commands: Any, tools: CommandTools) -> None:
    """`transactions list|abort` on the CLI's subcommands."""
    transactions = commands.add_parser("transactions", help="the Kafka transactions of a pipeline's sink that are "
                                                            "open or hanging: list them, end them")
    transactions_commands = transactions.add_subparsers(dest="transactions_command", required=True)
    for name, handler, help_text in (
            ("list", lambda ledger, args: cmd_list(ledger, args, tools),
             "open transactions of the pipeline's transactional ids (age, producer id, epoch, ledger batch) and "
             "hanging ones of its output (exit 1 if any)"),
            ("abort", lambda ledger, args: cmd_abort(ledger, args, tools),
             "end them: fence open ones, abort markers for hanging ones; a PREPARED batch's only with --force (exit "
             "3: some refused, 4: some outcome unknown)")):
        parser = tools.command(transactions_commands, name, handler, help_text, asks_kafka=True,
                               pipeline_help="pipeline id (omit it with --prefix)", optional_pipeline=True)
        parser.add_argument("--prefix", help="without a ledger: the transactional id prefix to look for (the "
                                             "sink's transactional_id_prefix, else the pipeline id)")
        parser.add_argument("--topic", action="append", default=[],
                            help="without a ledger: an output topic to search for hanging transactions")
        parser.set_defaults(ledger_needed=lambda args: not args.prefix)
        if name == "abort":
            parser.add_argument("--id", dest="transactional_id", help="only this transactional id")
            parser.add_argument("--force", action="store_true",
                                help="also abort transactions of PREPARED batches (the batch is then lost and "
                                     "processed again) and, without a ledger, hanging ones")


def cmd_list(ledger: Ledger | None, args: argparse.Namespace, tools: CommandTools) -> int:
    found = []
    for target, live in _transaction_targets(ledger, args, tools):
        with _kafka_failure(target.settings, "listing the pipeline's Kafka transactions"):
            found.append((target, lingering.survey(live, target.naming, target.topics, target.record)))
    rows = [t.as_row() for _, survey in found for t in survey.open] + \
        [h.as_row() for _, survey in found for h in survey.hanging]
    tools.print_rows(args, rows)
    for target, survey in found:
        for warning in survey.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        if not survey.scanned_topics:
            print(f"note: no topic searched for hanging transactions of ids {target.naming.prefix}-*: give --topic",
                  file=sys.stderr)
    return 1 if rows else 0


def cmd_abort(ledger: Ledger | None, args: argparse.Namespace, tools: CommandTools) -> int:
    results: list[lingering.AbortResult] = []
    for target, live in _transaction_targets(ledger, args, tools):
        with _kafka_failure(target.settings, "ending the pipeline's Kafka transactions"):
            survey = lingering.survey(live, target.naming, target.topics, target.record)
            results += lingering.end(survey, target.settings, live, target.naming, target.record,
                                     only=args.transactional_id, force=args.force,
                                     producer_config=target.producer_config,
                                     transaction_timeout_ms=target.transaction_timeout_ms)
    if args.transactional_id and not results:
        raise ConfigurationError(f"no open or hanging transaction {args.transactional_id!r} among the pipeline's "
                                 "(run `transactions list`)")
    tools.print_rows(args, [r.as_row() for r in results])
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


def _transaction_targets(ledger: Ledger | None, args: argparse.Namespace,
                         tools: CommandTools) -> Iterator[tuple[_TransactionTarget, LiveCluster]]:
    """Each Kafka output with its cluster (sinks.kafka.live_cluster: a node that just died is asked around;
    the clients are closed after the caller's loop step)."""
    for target in _targets(ledger, args, tools):
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


def _targets(ledger: Ledger | None, args: argparse.Namespace, tools: CommandTools) -> list[_TransactionTarget]:
    if ledger is None:  # --prefix: a lost ledger
        if not (args.bootstrap_servers or args.kafka_conn_id):
            raise ConfigurationError("--prefix needs the Kafka to ask: --bootstrap-servers HOSTS or "
                                     "--kafka-conn-id ID")
        settings = tools.kafka_settings(None, args)
        return [_TransactionTarget(IdNaming(args.prefix), tuple(args.topic), settings, lingering.PipelineRecord(),
                                   {}, 60_000)]
    if not args.pipeline:
        raise ConfigurationError("name the pipeline (transactions list PIPELINE), or give --prefix PREFIX and the "
                                 "Kafka to ask for a pipeline the ledger does not have")
    pid = args.pipeline
    config = PipelineConfig.from_dict(ledger.stored_config(pid))  # raises for a pipeline the ledger does not have
    committer = tools.pipeline_committer(config)
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
            else tools.kafka_settings(config, args)
        record = lingering.PipelineRecord(side.sweep.owners(), by_seq)
        targets.append(_TransactionTarget(output.naming, (output.topic, *args.topic), settings, record,
                                          output.producer_config, output.transaction_timeout_ms))
    return targets
