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
import sys
from typing import Sequence

from airflow_exactly_once.cli import changing, reading
from airflow_exactly_once.cli.connections import kafka_options, kafka_settings, ledger_options, ledger_url
from airflow_exactly_once.cli.output import print_rows
from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError
from airflow_exactly_once.core.ledger import Ledger, missing_sqlite_file
from airflow_exactly_once.sinks import pipeline_committer, sink_commands
from airflow_exactly_once.sinks.commands import CommandTools


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if not getattr(args, "ledger_needed", _always)(args):  # e.g. `transactions --prefix`: Kafka only
            return args.handler(None, args)
        url = ledger_url(args)
        access = "write" if getattr(args, "execute", False) else args.access
        # Readers never migrate, nor create tables, nor a SQLite file that does not exist yet.
        ledger = None if access == "read" and missing_sqlite_file(url) else Ledger(url)
        if ledger is not None and access == "write":  # a writer always has one (not missing_sqlite_file)
            ledger.create_schema()  # a writer upgrades on first use, like a batch does
        elif access == "read" and (ledger is None or not ledger.has_schema()):
            if args.command == "pipelines":
                print_rows(args, [])
                return 0
            raise ConfigurationError(f"the ledger {ledger.engine.url if ledger else url} holds no tables yet: no "
                                     "pipeline has run there")
        return args.handler(ledger, args)
    except ExactlyOnceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _always(_args: argparse.Namespace) -> bool:
    return True


def airflow_command(args: argparse.Namespace) -> None:
    """`airflow exactly-once [OPTIONS] COMMAND ...` (cli/definition.py): the same parser and output."""
    argv = [*(["--ledger-url", args.ledger_url] if args.ledger_url else []),
            *(["--ledger-conn-id", args.ledger_conn_id] if args.ledger_conn_id else []),
            *(["--json"] if args.json else []), *args.argv]
    code = main(argv)
    if code:
        raise SystemExit(code)


def parser() -> argparse.ArgumentParser:
    """Every command: the CLI's own (cli.reading, cli.changing), then those each sink adds (its declaration's
    `commands`)."""
    top = argparse.ArgumentParser(prog="airflow-exactly-once", description=__doc__.split("\n\n")[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    ledger_options(top, suppress=False)
    top.set_defaults(access="read")
    common = argparse.ArgumentParser(add_help=False)
    ledger_options(common, suppress=True)
    kafka = argparse.ArgumentParser(add_help=False)
    kafka_options(kafka)
    tools = CommandTools(common, kafka, print_rows, kafka_settings, pipeline_committer)
    commands = top.add_subparsers(dest="command", required=True)
    for add_commands in (reading.add_commands, changing.add_commands, *sink_commands()):
        add_commands(commands, tools)
    return top


if __name__ == "__main__":
    sys.exit(main())
