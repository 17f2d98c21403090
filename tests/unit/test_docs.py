"""The docs show tested code and link to pages that exist."""

from __future__ import annotations

import re

from devtools import docs


def test_included_code_matches_the_tested_files():
    assert docs.stale(write=False) == [], "run `python -m devtools.docs` to update the docs' code"


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


# A path the docs name: a folder of the repository or package-relative (`core/faults.py`), ending in a file
# with an extension or in a folder's slash. Placeholders (`test_<sink>.py`) and globs are not paths.
_NAMED_PATH = re.compile(r"(?<![\w/.<-])((?:airflow_exactly_once|benchmarks|dags|tests|devtools|docker|docs|core|sinks|"
                         r"spark|kafka|records|operators|hooks|ui|cli|triggers)/[\w./-]*(?:\.\w+|/))(?![\w<*{])")
# `make demo` in code, or a command line of a code block; not the verb in a sentence.
_MAKE_TARGET = re.compile(r"(?:`|^\s+|\$ )make ([a-z][\w-]*)", re.M)
_PLACEHOLDER = re.compile(r"[A-Z]{3,}_|<")  # NNNN_what.py, test_<sink>.py
# Named in the docs but made at build time: setup.py copies dags/ into the wheel there.
_BUILT = {"airflow_exactly_once/example_dags/"}


def named_paths(text: str) -> list[str]:
    return [m.group(1) for m in _NAMED_PATH.finditer(text)]


def test_every_path_and_make_target_the_docs_name_exists():
    targets = set(re.findall(r"^([a-z][\w-]*):", (docs.REPO / "Makefile").read_text(), re.M))
    missing = []
    for doc in docs.DOCS:
        text = doc.read_text()
        for path in named_paths(text):
            bases = (docs.REPO, docs.REPO / "airflow_exactly_once", doc.parent)
            if path not in _BUILT and not _PLACEHOLDER.search(path) and not any((base / path).exists() for base in bases):
                missing.append(f"{doc.relative_to(docs.REPO)}: {path}")
        missing += [f"{doc.relative_to(docs.REPO)}: make {t}" for t in _MAKE_TARGET.findall(text) if t not in targets]
    assert missing == [], "the docs name paths or make targets that do not exist"


def test_named_paths_finds_paths_and_leaves_placeholders():
    text = ("see `benchmarks/bench_gone.py`, core/faults.py and docs/sinks/ but not tests/integration/test_<sink>.py, "
            "records/s or tests/*.py; run `make test` or\n    make demo\nto make the tests pass")
    assert named_paths(text) == ["benchmarks/bench_gone.py", "core/faults.py", "docs/sinks/"]
    assert _MAKE_TARGET.findall(text) == ["test", "demo"]
    assert _PLACEHOLDER.search("core/ledger/migrations/versions/NNNN_what.py")


def test_every_airflow_config_section_has_its_generated_table_in_the_docs():
    from airflow_exactly_once.provider_info import CONFIG

    text = "".join(doc.read_text() for doc in docs.DOCS)
    for section in CONFIG:
        assert f"<!-- airflow-config: {section} -->\n{docs.config_table(section)}\n<!-- /airflow-config -->" in text


def test_the_metrics_table_in_the_docs_is_generated_from_the_metrics_module():
    from airflow_exactly_once.metrics import markdown_table

    page = (docs.REPO / "docs" / "operating.md").read_text()
    assert f"<!-- metrics -->\n{markdown_table()}\n<!-- /metrics -->" in page
