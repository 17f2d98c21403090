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
    from airflow_exactly_once.sinks import SINK_TYPES, SPECS

    assert set(SPECS) == set(SINK_TYPES)
    for kind, spec in SPECS.items():
        page = (docs.REPO / "docs" / "sinks" / f"{kind}.md").read_text()
        assert f"<!-- sink-options: {kind} -->\n{spec.markdown_table()}\n<!-- /sink-options -->" in page
