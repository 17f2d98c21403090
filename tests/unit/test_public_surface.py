"""The public surface: the modules a DAG author, a platform team or a sink's author imports, each with `__all__`;
every import the docs, the README and the example DAGs show names one of them and a name it exports. Every other
module is internal (docs/architecture.md, "The public surface") and may change in any release."""

from __future__ import annotations

import importlib
import re

import pytest

from devtools.docs import DOCS, REPO

PUBLIC_MODULES = (
    "airflow_exactly_once",
    "airflow_exactly_once.task_group",
    "airflow_exactly_once.operators.batch",
    "airflow_exactly_once.hooks.ledger",
    "airflow_exactly_once.hooks.schema_registry",
    "airflow_exactly_once.hooks.spark_submit",
    "airflow_exactly_once.triggers.backlog",
    "airflow_exactly_once.airflow_integration.assets",
    "airflow_exactly_once.spark.records",
    "airflow_exactly_once.spark.packages",
    # for a sink's author (docs/adding-a-sink.md)
    "airflow_exactly_once.core.errors",
    "airflow_exactly_once.core.sink",
    "airflow_exactly_once.core.sink_writer",
    "airflow_exactly_once.core.sink_committer",
    "airflow_exactly_once.core.declaration",
    "airflow_exactly_once.core.line_packages",
)
_IMPORT = re.compile(r"^\s*from (airflow_exactly_once[\w.]*) import \(?([\w, \n]+?)\)?\s*$", re.MULTILINE)


def shown_imports() -> list[tuple[str, str, str]]:
    """(file, module, name) of every `from airflow_exactly_once... import name` in the docs and example DAGs."""
    files = [*DOCS, *sorted((REPO / "dags").glob("*.py"))]
    return [(str(path.relative_to(REPO)), m.group(1), name.strip())
            for path in files for m in _IMPORT.finditer(path.read_text())
            for name in m.group(2).replace("\n", " ").split(",") if name.strip()]


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_a_public_module_says_what_it_exports_and_has_it(module):
    imported = importlib.import_module(module)
    exported = getattr(imported, "__all__", None)
    assert exported, f"{module} is public but has no __all__"
    assert [name for name in exported if not hasattr(imported, name)] == []


def test_what_the_docs_and_dags_import_is_public():
    shown = shown_imports()
    assert len(shown) >= 10 and ("dags/kafka_to_parquet.py", "airflow_exactly_once.task_group",
                                 "exactly_once_batch") in shown
    private = [(path, module, name) for path, module, name in shown
               if module not in PUBLIC_MODULES or name not in importlib.import_module(module).__all__]
    assert private == [], "the docs show imports of internal names: export them, or show a public one"
