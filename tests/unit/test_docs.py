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
