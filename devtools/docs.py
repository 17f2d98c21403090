"""Keep the docs' code in step with the tested files it is taken from.

A Markdown file includes a region of a tested file (an example DAG, a test) like this:

    <!-- include: dags/kafka_to_parquet.py pipeline -->
    ```python
    ...the lines between "# [START pipeline]" and "# [END pipeline]" in that file...
    ```

a sink's option table (made by its spec declaration, SinkSpec.markdown_table) like this:

    <!-- sink-options: kafka -->
    | sink key | ...
    <!-- /sink-options -->

the operators' argument table like this:

    <!-- arguments -->
    | argument | ... (made by airflow_exactly_once.operators.arguments.markdown_table)
    <!-- /arguments -->

the options of a section of airflow.cfg that the provider declares (provider_info.CONFIG) like this:

    <!-- airflow-config: exactly_once -->
    | option | ...
    <!-- /airflow-config -->

the table of every metric (made by airflow_exactly_once.airflow_integration.metrics.markdown_table) like this:

    <!-- metrics -->
    | metric | ...
    <!-- /metrics -->

and, in docs/troubleshooting.md, what an error class says of itself (its heading, meaning, base class and
whether Airflow retries it), above the hand-written "What to do", like this:

    <!-- error: airflow_exactly_once.core.errors.DataLossError -->
    ## `DataLossError` (core.errors) ...
    <!-- /error -->

The package's own source has generated parts too, written from a declaration by a function of the package:

    # [START generated: operators.arguments.init_source signature]
    ...what airflow_exactly_once.operators.arguments.init_source("signature") returns, indented as the marker...
    # [END generated: operators.arguments.init_source signature]

`python -m devtools.docs` (`make docs`) rewrites the included blocks, tables and generated source; tests/unit/test_docs.py fails when a
block and its source disagree, so the docs never show code that was not tested.

The docs' other tables of names (a trigger's arguments, CLI commands, extras) are hand-written and
checked against their declarations by tests/unit/test_doc_tables.py, with `doc_table` below.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil
import re
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").rglob("*.md"))]
SOURCES = sorted((REPO / "airflow_exactly_once").rglob("*.py"))
_GENERATED = re.compile(r"^(?P<indent>[ \t]*)(?P<start># \[START generated: (?P<source>[\w.]+) (?P<part>\w+)\]\n)"
                        r"(?P<body>.*?)^(?P=indent)# \[END generated: (?P=source) (?P=part)\]", re.DOTALL | re.MULTILINE)
_INCLUDE = re.compile(r"(<!-- include: (?P<path>\S+) (?P<region>\S+) -->\n```(?P<lang>\w*)\n)(?P<body>.*?)(```)",
                      re.DOTALL)
_ARGUMENTS = re.compile(r"(<!-- arguments -->\n)(?P<body>.*?)(<!-- /arguments -->)", re.DOTALL)
_SINK_OPTIONS = re.compile(r"(<!-- sink-options: (?P<sink>\w+) -->\n)(?P<body>.*?)(<!-- /sink-options -->)", re.DOTALL)
_METRICS = re.compile(r"(<!-- metrics -->\n)(?P<body>.*?)(<!-- /metrics -->)", re.DOTALL)
_ERROR = re.compile(r"(<!-- error: (?P<path>[\w.]+) -->\n)(?P<body>.*?)(<!-- /error -->)", re.DOTALL)
_AIRFLOW_CONFIG = re.compile(r"(<!-- airflow-config: (?P<section>\w+) -->\n)(?P<body>.*?)(<!-- /airflow-config -->)",
                             re.DOTALL)
# A Markdown table: its header, the |---| line, and the rows up to the first line that is not one.
_TABLE = re.compile(r"^(\|.*\|)\n\|[-:| ]+\|\n((?:\|.*\|(?:\n|$))*)", re.MULTILINE)
_CODE = re.compile(r"`([^`]+)`")


def region(path: Path, name: str) -> str:
    """The lines between `# [START name]` and `# [END name]`, dedented."""
    text = path.read_text()
    match = re.search(rf"^[ \t]*# \[START {re.escape(name)}\]\n(.*?)^[ \t]*# \[END {re.escape(name)}\]",
                      text, re.DOTALL | re.MULTILINE)
    if match is None:
        raise LookupError(f"{path.relative_to(REPO)} has no region {name!r} (# [START {name}] ... # [END {name}])")
    return textwrap.dedent(match.group(1))


def config_table(section: str) -> str:
    """The options of `[section]` in airflow.cfg, as the provider declares them for Airflow."""
    from airflow_exactly_once.airflow_integration.provider_info import CONFIG

    rows = ["| option | default | what |", "|---|---|---|"]
    for name, option in CONFIG[section]["options"].items():
        default = "none" if option["default"] is None else f"`{option['default']}`"
        rows.append(f"| `[{section}] {name}` | {default} | {option['description']} |")
    return "\n".join(rows)


def error_classes() -> list[type]:
    """Every error class of the package (ExactlyOnceError and its subclasses, every module imported), by module and
    name: what docs/troubleshooting.md has a section for."""
    import airflow_exactly_once
    from airflow_exactly_once.core.errors import ExactlyOnceError

    for module in pkgutil.walk_packages(airflow_exactly_once.__path__, "airflow_exactly_once."):
        if not module.name.endswith(".__main__"):  # the console scripts run when imported
            importlib.import_module(module.name)
    found, todo = {ExactlyOnceError}, [ExactlyOnceError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found and sub.__module__.startswith("airflow_exactly_once."):
                found.add(sub)
                todo.append(sub)
    return sorted(found, key=class_path)


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def error_section(path: str) -> str:
    """An error class's heading, its meaning (its docstring's first paragraph), its base class and whether Airflow
    retries it, for its section of docs/troubleshooting.md."""
    from airflow_exactly_once.core.errors import ExactlyOnceError

    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name, None) if module else None
    if not (isinstance(cls, type) and issubclass(cls, ExactlyOnceError)):
        raise LookupError(f"docs/troubleshooting.md has a section for {path}, which is not an error class of the "
                          "package (any more): remove the section, or name the class where it is now")
    meaning = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ").replace("``", "`")
    base = next((b for b in cls.__mro__[1:] if issubclass(b, ExactlyOnceError)), None)
    retried = ("**yes**: Airflow retries the task (its `retries`)" if cls.retriable else
               "**no**: the task fails at once, without its retries")
    return "\n".join([
        f"## `{name}` ({module.removeprefix('airflow_exactly_once.')})", "",
        meaning, "",
        f"`{path}`" + (f", a subclass of `{base.__name__}`." if base else
                       ", the base of every error of the provider.") +
        f" Retried: {retried} (the class's default; a raise where a retry can help may mark its error retriable)."])


def render(text: str) -> str:
    """`text` with every include and generated table made anew from their sources."""
    from airflow_exactly_once.airflow_integration.metrics import markdown_table as metrics_table
    from airflow_exactly_once.operators.arguments import markdown_table
    from airflow_exactly_once.sinks import SPECS

    text = _INCLUDE.sub(lambda m: m.group(1) + region(REPO / m.group("path"), m.group("region")) + m.group(6),
                        text)
    text = _SINK_OPTIONS.sub(lambda m: m.group(1) + SPECS[m.group("sink")].markdown_table() + "\n" + m.group(4),
                             text)
    text = _AIRFLOW_CONFIG.sub(lambda m: m.group(1) + config_table(m.group("section")) + "\n" + m.group(4), text)
    text = _METRICS.sub(lambda m: m.group(1) + metrics_table() + "\n" + m.group(3), text)
    text = _ERROR.sub(lambda m: m.group(1) + error_section(m.group("path")) + "\n" + m.group(4), text)
    return _ARGUMENTS.sub(lambda m: m.group(1) + markdown_table() + "\n" + m.group(3), text)


def generated_source(match: re.Match) -> str:
    """A generated part of the package's source, made anew by the function its START marker names."""
    module, _, function = match.group("source").rpartition(".")
    made = getattr(importlib.import_module(f"airflow_exactly_once.{module}"), function)(match.group("part"))
    indent = match.group("indent")
    return (indent + match.group("start") + textwrap.indent(made, indent) + "\n" +
            f"{indent}# [END generated: {match.group('source')} {match.group('part')}]")


def render_source(text: str) -> str:
    """`text` (a module of the package) with every generated part made anew."""
    return _GENERATED.sub(generated_source, text) if "# [START generated: " in text else text


def cells(line: str) -> list[str]:
    """The cells of a table line; `\\|` is a pipe inside a cell."""
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table of `text`: its header's cells, then each row's."""
    return [[cells(m.group(1)), *(cells(line) for line in m.group(2).splitlines())] for m in _TABLE.finditer(text)]


def doc_table(doc: str, first_header: str) -> list[list[str]]:
    """The rows of the one table of `doc` (a path from the repository's root) whose first column is headed
    `first_header`, each row its cells."""
    found = [t for t in tables((REPO / doc).read_text()) if t[0][0] == first_header]
    if len(found) != 1:
        raise LookupError(f"{doc} has {len(found)} tables whose first column is headed {first_header!r}, not one: "
                          "rename the header in the test that reads it, or tell the tables apart")
    return found[0][1:]


def code_names(cell: str) -> list[str]:
    """The names a cell shows as code (`earliest`, `"bytes"` -> bytes), in order."""
    return [name.strip('"') for name in _CODE.findall(cell)]


def cli_commands(parser: argparse.ArgumentParser, path: str = "") -> dict[str, set[str]]:
    """Each command of an argparse parser (`db upgrade` for a nested one) with its --options."""
    nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not nested:
        return {path: {o for a in parser._actions for o in a.option_strings if o.startswith("--")}}
    return {command: options for action in nested for name, sub in action.choices.items()
            for command, options in cli_commands(sub, f"{path} {name}".strip()).items()}


def stale(write: bool = False) -> list[Path]:
    """The docs (and modules) whose included code or generated parts differ from their source (rewritten when
    `write`)."""
    found = []
    for doc in [*DOCS, *SOURCES]:
        text = doc.read_text()
        fresh = render(text) if doc.suffix == ".md" else render_source(text)
        if fresh != text:
            found.append(doc)
            if write:
                doc.write_text(fresh)
    return found


def main(argv: list[str] | None = None) -> int:
    write = "--check" not in (argv if argv is not None else sys.argv[1:])
    changed = stale(write=write)
    for doc in changed:
        print(f"{'rewrote' if write else 'stale'}: {doc.relative_to(REPO)}")
    return 1 if changed and not write else 0


if __name__ == "__main__":
    sys.exit(main())
