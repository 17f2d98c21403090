"""What the `airflow-exactly-once` CLI hands the commands a sink adds (a declaration's `commands`).

The CLI knows no sink, and a sink's commands know no CLI: they get the options every command takes (as argparse
parents), how the CLI prints rows, how it finds the Kafka settings a command asks with (the ledger's, a kafka
connection's, or --bootstrap-servers; Airflow's connections only when asked for), and a pipeline's committer (so that a
sink's commands need not import the registry above them).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.kafka.settings import KafkaSettings

__all__ = ["CommandTools"]


@dataclass(frozen=True)
class CommandTools:
    """`common`: --ledger-url, --ledger-conn-id and --json after the command; `kafka`: --bootstrap-servers and
    --kafka-conn-id (both argparse parents). A handler is set as `handler(ledger, args) -> exit code`; a command that
    can work without a ledger sets `ledger_needed(args) -> bool` beside it."""

    common: argparse.ArgumentParser
    kafka: argparse.ArgumentParser
    print_rows: Callable[[argparse.Namespace, list[dict[str, Any]]], None]
    kafka_settings: Callable[[PipelineConfig | None, argparse.Namespace], KafkaSettings]
    pipeline_committer: Callable[[PipelineConfig], SinkCommitter]  # sinks.pipeline_committer (its dead letters paired)

    def command(self, commands: Any, name: str, handler: Callable[..., int], help_text: str, *,
                pipeline_help: str = "pipeline id", optional_pipeline: bool = False,
                asks_kafka: bool = False) -> argparse.ArgumentParser:
        """A command about one pipeline, added to `commands` (an argparse subparsers object); `asks_kafka`: it takes
        the Kafka options."""
        parser = commands.add_parser(name, help=help_text,
                                     parents=[self.common, self.kafka] if asks_kafka else [self.common])
        parser.add_argument("pipeline", help=pipeline_help, **({"nargs": "?"} if optional_pipeline else {}))
        parser.set_defaults(handler=handler)
        return parser
