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

and the operators' argument table like this:

    <!-- arguments -->
    | argument | ... (made by airflow_exactly_once.operators.arguments.markdown_table)
    <!-- /arguments -->

`python -m devtools.docs` rewrites the included blocks; tests/unit/test_docs.py fails when a
block and its source disagree, so the docs never show code that was not tested.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_INCLUDE = re.compile(r"(<!-- include: (?P<path>\S+) (?P<region>\S+) -->\n```(?P<lang>\w*)\n)(?P<body>.*?)(```)",
                      re.DOTALL)
_ARGUMENTS = re.compile(r"(<!-- arguments -->\n)(?P<body>.*?)(<!-- /arguments -->)", re.DOTALL)
_SINK_OPTIONS = re.compile(r"(<!-- sink-options: (?P<sink>\w+) -->\n)(?P<body>.*?)(<!-- /sink-options -->)", re.DOTALL)


def region(path: Path, name: str) -> str:
    """The lines between `# [START name]` and `# [END name]`, dedented."""
    text = path.read_text()
    match = re.search(rf"^[ \t]*# \[START {re.escape(name)}\]\n(.*?)^[ \t]*# \[END {re.escape(name)}\]",
                      text, re.DOTALL | re.MULTILINE)
    if match is None:
        raise LookupError(f"{path.relative_to(REPO)} has no region {name!r} (# [START {name}] ... # [END {name}])")
    return textwrap.dedent(match.group(1))


def render(text: str) -> str:
    """`text` with every include and the argument table made anew from their sources."""
    from airflow_exactly_once.operators.arguments import markdown_table
    from airflow_exactly_once.sinks import SPECS

    text = _INCLUDE.sub(lambda m: m.group(1) + region(REPO / m.group("path"), m.group("region")) + m.group(6),
                        text)
    text = _SINK_OPTIONS.sub(lambda m: m.group(1) + SPECS[m.group("sink")].markdown_table() + "\n" + m.group(4),
                             text)
    return _ARGUMENTS.sub(lambda m: m.group(1) + markdown_table() + "\n" + m.group(3), text)


def stale(write: bool = False) -> list[Path]:
    """The docs whose included code differs from its source (rewritten when `write`)."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        fresh = render(text)
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
