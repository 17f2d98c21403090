"""Every sink is a writer and a committer made from one declared spec; the commit side never needs the write side."""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect

import pytest

from airflow_exactly_once.core.declaration import SinkSpec
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.core.sink_writer import SinkWriter
from airflow_exactly_once.sinks import SPECS, create_committer, create_writer
from airflow_exactly_once.sinks.parquet.spec import ParquetSpec
from tests.unit.test_imports import MODULES, internal_graph


def declared(spec: type[SinkSpec], side: str) -> type:
    module, _, name = getattr(spec, side).partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("kind", sorted(SPECS))
def test_each_declaration_names_its_writer_and_committer(kind):
    spec = SPECS[kind]
    writer, committer = declared(spec, "writer_class"), declared(spec, "committer_class")
    assert issubclass(writer, SinkWriter) and issubclass(committer, SinkCommitter)
    assert writer.spec_type is spec and committer.spec_type is spec


def methods(cls: type) -> list[str]:
    """Every def in the class body: methods, properties, static and private helpers."""
    body = ast.parse(inspect.getsource(cls)).body[0]
    return [node.name for node in body.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


@pytest.mark.parametrize("kind", ["kafka", "postgres"])
@pytest.mark.parametrize("side", ["writer_class", "committer_class"])
def test_the_largest_sinks_keep_each_side_small(kind, side):
    """Issue 46's measure: their helpers live in collaborators (Kafka's hanging-transaction sweep and commit
    judging, PostgreSQL's table and prepared attempts), not in the writer or the committer."""
    found = methods(declared(SPECS[kind], side))
    assert len(found) <= 12, found


def reachable(start: str) -> set[str]:
    graph, seen, todo = internal_graph(), set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    return seen


VARIANT_SIDES = [(kind, name, sides) for kind in sorted(SPECS) for name, sides in SPECS[kind].variant_classes.items()]


@pytest.mark.parametrize("kind,name,sides", VARIANT_SIDES)
def test_each_variant_names_a_writer_and_committer_of_its_declaration(kind, name, sides):
    made = [getattr(importlib.import_module(s.partition(":")[0]), s.partition(":")[2]) for s in sides]
    assert issubclass(made[0], SinkWriter) and issubclass(made[1], SinkCommitter)
    assert made[0].spec_type is SPECS[kind] and made[1].spec_type is SPECS[kind]


@pytest.mark.parametrize("module", ["airflow_exactly_once.core.protocol", "airflow_exactly_once.cli.main",
                                    *(SPECS[k].committer_class.partition(":")[0] for k in sorted(SPECS)),
                                    *(sides[1].partition(":")[0] for _, _, sides in VARIANT_SIDES)])
def test_the_commit_side_never_imports_a_writer(module):
    """notify_complete, recovery and the CLI build committers only: no sink writer module is even imported."""
    writers = {name for name in MODULES
               if name.startswith("airflow_exactly_once.sinks.") and name.endswith(".sink_writer")}
    assert module in MODULES and reachable(module) & writers == set()


def test_a_declaration_without_its_classes_is_refused_naming_what_to_set(monkeypatch):
    class HalfSpec(ParquetSpec):
        type_name = "half"
        writer_class = ""  # forgotten
        committer_class = "airflow_exactly_once.sinks.parquet.sink_committer:ParquetSinkCommitter"

    monkeypatch.setitem(SPECS, "half", HalfSpec)
    with pytest.raises(ConfigurationError, match="HalfSpec.*names no writer_class as 'module:Class'"):
        create_writer({"type": "half", "path": "/tmp/half"})
    assert create_committer({"type": "half", "path": "/tmp/half"}).layout.root.name == "half"  # the side it names


def test_a_sinks_cli_commands_come_from_its_declaration(monkeypatch, capsys, tmp_path):
    """The CLI adds what each declaration's `commands` names (the Kafka sink's `transactions`); a sink without
    commands adds none, and one whose declaration names a function gets its commands on the CLI."""
    from airflow_exactly_once.cli.main import main, parser
    from airflow_exactly_once.sinks.kafka.spec import KafkaSpec

    def listed() -> set[str]:
        action = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
        return set(action.choices)

    assert "transactions" in listed() and KafkaSpec.commands.endswith(":add_commands")
    monkeypatch.setattr(KafkaSpec, "commands", "")
    assert "transactions" not in listed()

    def add_hello(commands, tools):
        tools.command(commands, "hello", lambda ledger, args: print(f"hello {args.pipeline}") or 0, "say hello")

    monkeypatch.setattr(ParquetSpec, "commands", f"{__name__}:{add_hello.__name__}")
    monkeypatch.setitem(globals(), "add_hello", add_hello)
    assert "hello" in listed()
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    Ledger(url).create_schema()
    assert main(["hello", "orders", "--ledger-url", url]) == 0
    assert capsys.readouterr().out == "hello orders\n"
