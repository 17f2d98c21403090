"""The docs show tested code and link to pages that exist."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from devtools import docs


def test_included_code_matches_the_tested_files():
    assert docs.stale(write=False) == [], "run `make docs` (python -m devtools.docs) to update the docs' generated parts"


def test_an_include_of_a_missing_region_fails():
    try:
        docs.render("<!-- include: dags/kafka_to_parquet.py no_such_region -->\n```python\nx\n```")
    except LookupError as error:
        assert "no region 'no_such_region'" in str(error)
    else:
        raise AssertionError("a missing region must fail")


def test_relative_links_resolve():
    broken = []
    for doc in docs.DOCS:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(docs.REPO)} -> {target}")
    assert broken == []


def test_every_registered_sink_has_a_declaration_and_its_generated_table_in_the_docs():
    from airflow_exactly_once.sinks import SPECS

    for kind, spec in SPECS.items():
        page = (docs.REPO / "docs" / "sinks" / f"{kind}.md").read_text()
        assert f"<!-- sink-options: {kind} -->\n{spec.markdown_table()}\n<!-- /sink-options -->" in page


# What names files, make targets and commands a reader acts on: the docs, the example DAGs (their docstrings and
# comments name their tests and pages) and the Makefile (its comments and recipes name tests and commands).
SOURCES = [*docs.DOCS, *sorted((docs.REPO / "dags").glob("*.py")), docs.REPO / "Makefile"]

# A path: a folder of the repository or package-relative (`core/faults.py`), ending in a file with an extension
# or in a folder's slash. Placeholders (`test_<sink>.py`) and globs are not paths.
_NAMED_PATH = re.compile(r"(?<![\w/.<-])((?:airflow_exactly_once|benchmarks|dags|tests|devtools|docker|docs|core|sinks|"
                         r"spark|kafka|records|operators|hooks|ui|cli|triggers)/[\w./-]*(?:\.\w+|/))(?![\w<*{])")
# A test or benchmark file, with or without its folder, and the test it names after `::`.
_TEST_FILE = re.compile(r"(?<![\w<-])((?:[\w-]+/)*(?:test|bench)_\w+\.py)(?:::(\w+))?")
# `make demo` in code, or a command line of a code block or recipe; not the verb in a sentence.
_MAKE_TARGET = re.compile(r"(?:`|^\s+|\$ )make ([a-z][\w-]*)", re.M)
# The ledger CLI (console script or Airflow's CLI) in code: what follows it up to the code's end.
_LEDGER_CLI = re.compile(r"(?:`|^[ \t]+(?:# )?|\$ )(?:airflow-exactly-once|airflow exactly-once)((?: +[^\s`#]+)*)",
                         re.M)
# The repository's tools: `python -m devtools COMMAND` or `-m devtools.module`.
_DEVTOOLS = re.compile(r"-m devtools(?:\.(\w+)| ([a-z][\w-]*))")
_PLACEHOLDER = re.compile(r"[A-Z]{3,}_|<")  # NNNN_what.py, test_<sink>.py
# Named in the docs but made at build time: setup.py copies dags/ into the wheel there.
_BUILT = {"airflow_exactly_once/example_dags/"}


def named_paths(text: str) -> list[str]:
    return [m.group(1) for m in _NAMED_PATH.finditer(text)]


def _missing_path(path: str, source: Path) -> bool:
    bases = (docs.REPO, docs.REPO / "airflow_exactly_once", source.parent)
    return path not in _BUILT and not _PLACEHOLDER.search(path) and not any((b / path).exists() for b in bases)


def _test_file(name: str, source: Path) -> Path | None:
    """The file a test or benchmark name points at: as a path, or a bare file name found under tests/ or
    benchmarks/ (one file of that name)."""
    if "/" in name:
        found = list({base / name for base in (docs.REPO, source.parent) if (base / name).exists()})
    else:
        found = [*(docs.REPO / "tests").rglob(name), *(docs.REPO / "benchmarks").glob(name)]
    return found[0] if len(found) == 1 else None


def missing_tests(text: str, source: Path) -> list[str]:
    """Test files and tests (`file.py::test_name`) that `text` names but do not exist."""
    missing = []
    for match in _TEST_FILE.finditer(text):
        name, test = match.groups()
        found = _test_file(name, source)
        if found is None:
            missing.append(name)
        elif test and not re.search(rf"^\s*(?:async )?def {test}\(", found.read_text(), re.M):
            missing.append(f"{name}::{test}")
    return missing


def missing_cli_commands(text: str) -> list[str]:
    """Ledger CLI command lines in `text` whose command or --options the CLI does not have."""
    from airflow_exactly_once.cli.main import parser as cli_parser

    parser = cli_parser()
    commands = docs.cli_commands(parser)
    common = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    valued = {o for a in parser._actions if a.nargs != 0 for o in a.option_strings}  # --ledger-url URL
    missing = []
    for match in _LEDGER_CLI.finditer(text):
        words = [w.strip("[]|") for w in match.group(1).split()]
        rest = [w for i, w in enumerate(words) if not w.startswith("--") and (i == 0 or words[i - 1] not in valued)]
        if not rest or not re.fullmatch(r"[a-z][a-z-]*", rest[0]):
            continue  # `airflow-exactly-once` alone, or COMMAND / ... as a placeholder
        nested = len(rest) > 1 and any(c.startswith(rest[0] + " ") for c in commands)  # `db upgrade`, `transactions list`
        command = " ".join(rest[:2]) if nested else rest[0]
        if command not in commands:
            missing.append(f"airflow-exactly-once {command}")
            continue
        missing += [f"airflow-exactly-once {command} {o}" for o in (w.split("=")[0] for w in words)
                    if o.startswith("--") and o not in commands[command] | common]
    return missing


def missing_devtools(text: str) -> list[str]:
    """`python -m devtools COMMAND` commands and `-m devtools.module` modules that do not exist."""
    from devtools.__main__ import main

    missing = []
    for module, command in _DEVTOOLS.findall(text):
        if module and not (docs.REPO / "devtools" / f"{module}.py").exists():
            missing.append(f"-m devtools.{module}")
        if command:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                try:
                    main([command, "--help"])
                except SystemExit as exited:
                    if exited.code != 0:
                        missing.append(f"python -m devtools {command}")
    return missing


def test_every_path_test_make_target_and_command_named_exists():
    targets = set(re.findall(r"^([a-z][\w-]*):", (docs.REPO / "Makefile").read_text(), re.M))
    missing = []
    for source in SOURCES:
        text = source.read_text()
        named = [p for p in named_paths(text) if _missing_path(p, source)]
        named += missing_tests(text, source)
        named += [f"make {t}" for t in _MAKE_TARGET.findall(text) if t not in targets]
        named += missing_cli_commands(text) + missing_devtools(text)
        missing += [f"{source.relative_to(docs.REPO)}: {name}" for name in dict.fromkeys(named)]
    assert missing == [], "these name paths, tests, make targets or commands that do not exist"


def test_named_paths_finds_paths_and_leaves_placeholders():
    text = ("see `benchmarks/bench_gone.py`, core/faults.py and docs/sinks/ but not tests/integration/test_<sink>.py, "
            "records/s or tests/*.py; run `make test` or\n    make demo\nto make the tests pass")
    assert named_paths(text) == ["benchmarks/bench_gone.py", "core/faults.py", "docs/sinks/"]
    assert _MAKE_TARGET.findall(text) == ["test", "demo"]
    assert _PLACEHOLDER.search("core/ledger/migrations/versions/NNNN_what.py")


def test_missing_tests_names_moved_files_and_tests_that_do_not_exist():
    source = docs.REPO / "dags" / "kafka_to_parquet.py"
    text = ("tests/test_pipeline_parquet.py moved; test_pipeline_parquet.py and tests/system/test_pipeline_parquet.py "
            "exist, test_pipeline_parquet.py::test_no_such_test does not, test_<sink>.py is a placeholder, "
            "bench_scale.py is a benchmark, tests/unit/test_docs.py::test_missing_tests_names_moved_files_and_tests"
            "_that_do_not_exist is this one")
    assert missing_tests(text, source) == ["tests/test_pipeline_parquet.py",
                                           "test_pipeline_parquet.py::test_no_such_test"]


def test_missing_cli_commands_checks_the_command_and_its_options():
    text = ("`airflow-exactly-once prune orders --keep-days 3 --execute`, `airflow-exactly-once` alone,\n"
            "    airflow exactly-once --ledger-conn-id eo batches orders --state COMMITTED --json\n"
            "    airflow-exactly-once db upgrade\n"
            "`airflow exactly-once COMMAND --help`, `airflow-exactly-once purge orders`, "
            "`airflow-exactly-once rewind orders --to-time 2024-05-01 --dry-run`, `airflow-exactly-once db downgrade`")
    assert missing_cli_commands(text) == ["airflow-exactly-once purge", "airflow-exactly-once rewind --dry-run",
                                          "airflow-exactly-once db downgrade"]


def test_missing_devtools_asks_the_tools_themselves():
    text = "python -m devtools fetch-jars, $(PY) -m devtools.demo, -m devtools fetch-all, -m devtools.no_such_tool"
    assert missing_devtools(text) == ["python -m devtools fetch-all", "-m devtools.no_such_tool"]


def test_troubleshooting_has_a_section_for_every_error_class_and_for_no_other():
    page = (docs.REPO / "docs" / "troubleshooting.md").read_text()
    sections = re.findall(r"<!-- error: ([\w.]+) -->", page)
    classes = [docs.class_path(cls) for cls in docs.error_classes()]
    assert len(sections) == len(set(sections)), "docs/troubleshooting.md: one section per class"
    assert sorted(set(classes) - set(sections)) == [], "add a section for each of these to docs/troubleshooting.md " \
                                                       "(<!-- error: CLASS --><!-- /error -->, What to do, make docs)"
    assert sorted(set(sections) - set(classes)) == [], "docs/troubleshooting.md: these classes do not exist"
    for path, after in re.findall(r"<!-- error: ([\w.]+) -->.*?<!-- /error -->\n(.*?)(?=<!-- error: |\Z)", page, re.S):
        assert re.search(r"\*\*What to do\*\*: \S", after), f"docs/troubleshooting.md: what to do about {path}"


def test_an_error_section_of_a_class_that_is_gone_names_it():
    gone = "airflow_exactly_once.core.errors.NoSuchError"
    with pytest.raises(LookupError, match=f"section for {gone}, which is not an error class of the package"):
        docs.render(f"<!-- error: {gone} -->\n<!-- /error -->")


def test_error_classes_finds_the_sinks_own_classes_beside_the_core():
    paths = [docs.class_path(cls) for cls in docs.error_classes()]
    assert "airflow_exactly_once.core.errors.ExactlyOnceError" in paths
    assert "airflow_exactly_once.core.errors.ConfigurationError" in paths
    assert any(p.startswith("airflow_exactly_once.sinks.") for p in paths)
    assert all(p.startswith("airflow_exactly_once.") for p in paths)  # no test's or library's classes


def test_every_airflow_config_section_has_its_generated_table_in_the_docs():
    from airflow_exactly_once.airflow_integration.provider_info import CONFIG

    text = "".join(doc.read_text() for doc in docs.DOCS)
    for section in CONFIG:
        assert f"<!-- airflow-config: {section} -->\n{docs.config_table(section)}\n<!-- /airflow-config -->" in text


def test_the_metrics_table_in_the_docs_is_generated_from_the_metrics_module():
    from airflow_exactly_once.airflow_integration.metrics import markdown_table

    page = (docs.REPO / "docs" / "operating.md").read_text()
    assert f"<!-- metrics -->\n{markdown_table()}\n<!-- /metrics -->" in page
