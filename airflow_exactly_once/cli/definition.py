"""`airflow exactly-once ...`: the ledger CLI as a command of Airflow's own CLI (Airflow >= 3.2).

Listed under the `cli` key of the provider info. Airflow imports this module on every CLI call,
so it only describes the command; the work is done by airflow_exactly_once.cli.main, loaded
when the command runs. Everything after `exactly-once` goes to that module's parser unchanged,
so `airflow exactly-once ARGS` and the console script `airflow-exactly-once ARGS` are the same.
"""

from __future__ import annotations

import argparse

from airflow.cli.cli_config import ActionCommand, Arg, lazy_load_command

COMMAND = "exactly-once"


def get_cli_commands() -> list[ActionCommand]:
    return [
        ActionCommand(
            name=COMMAND,
            help="Look into the exactly-once offset ledger, check it, mirror or rewind a pipeline, prune it, upgrade "
                 "its schema, list or end its Kafka transactions",
            # Every command of cli.main's parser (tests/unit/test_doc_tables.py compares them).
            description="The commands of the `airflow-exactly-once` console script: pipelines, batches, show, "
                        "positions, events, check, mirror, rewind, prune, transactions, db. `airflow exactly-once COMMAND --help` "
                        "tells more.",
            func=lazy_load_command("airflow_exactly_once.cli.main.airflow_command"),
            args=(
                # The options that the console script takes before its command, so they work here too.
                Arg(("--ledger-url",), help="SQLAlchemy URL of the ledger"),
                Arg(("--ledger-conn-id",), help="an Airflow connection holding the ledger"),
                Arg(("--json",), help="print JSON instead of tables", action="store_true"),
                Arg(("argv",), help="COMMAND [ARGS...], e.g. batches orders --state COMMITTED",
                    nargs=argparse.REMAINDER, metavar="COMMAND"),
            ),
        )
    ]
