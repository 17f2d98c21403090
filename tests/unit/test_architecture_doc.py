"""docs/architecture.md says what the code is: every module, class and function it names in backticks exists, the
imports between rooms are those its table allows, and every named crash point has its row."""

from __future__ import annotations

import ast
import importlib
import re
from functools import lru_cache
from pathlib import Path

from devtools.docs import REPO, doc_table
from tests.unit.test_imports import folder_graph, internal_graph

from airflow_exactly_once.core.faults import POINTS

DOC = "docs/architecture.md"
PACKAGE = REPO / "airflow_exactly_once"
# Names of Airflow and Spark the page mentions: not the package's own.
OUTSIDE = {"AirflowFailException", "collect()", "datasource.py"}
_CODE = re.compile(r"`([^`]+)`")
_CLASS = re.compile(r"[A-Z]\w*(\.\w+)?")
_DOTTED = re.compile(r"[a-z_]+(\.\w+)+")


@lru_cache(maxsize=1)
def defined() -> tuple[dict[str, set[str]], set[str]]:
    """Every class of the package with the names its body defines; every module-level function and constant."""
    classes: dict[str, set[str]] = {}
    functions: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                functions.update(t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper())
            if isinstance(node, ast.ClassDef):
                body = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                body |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets
                         if isinstance(t, ast.Name)}
                body |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)
                         and isinstance(n.target, ast.Name)}
                classes.setdefault(node.name, set()).update(body)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.add(node.name)
    return classes, functions


def missing(token: str) -> bool:
    """Whether a name the page shows as code is one of the package's and does not exist (values and options are
    not names: they are not checked)."""
    classes, functions = defined()
    if token in OUTSIDE or " " in token or '"' in token:
        return False
    if "/" in token or token.endswith(".py"):
        return not any(any(root.glob(token.rstrip("/"))) for root in (PACKAGE, REPO))
    if token.endswith("()"):
        return token[:-2] not in functions
    if token.isupper():  # a constant, or a member of an enum (a state)
        return token not in functions and not any(token in body for body in classes.values())
    if _CLASS.fullmatch(token):
        name, _, attribute = token.partition(".")
        return name not in classes or bool(attribute) and attribute not in classes[name]
    if _DOTTED.fullmatch(token) and (PACKAGE / token.split(".")[0]).exists():
        return not resolves(token)
    return False


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(["airflow_exactly_once", *parts[:cut]]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True
    return False


def room(cell: str) -> str:
    """A room as test_imports names it: `core/` -> core, `task_group.py` -> task_group, `__init__.py` -> the
    package itself."""
    name = cell.strip("`").rstrip("/").removesuffix(".py")
    return "airflow_exactly_once" if name == "__init__" else name


def test_every_name_the_page_shows_exists():
    names = _CODE.findall((REPO / DOC).read_text())
    assert len(names) > 150
    assert [name for name in dict.fromkeys(names) if missing(name)] == []


def test_the_check_finds_names_that_do_not_exist():
    assert [n for n in ("BatchCoordinator.recover", "plan_batch()", "core/ledger/batch.py", "core.states.BatchState",
                        "tests/system/test_pipeline_*.py", "PLANNED", "one_failed") if missing(n)] == []
    assert [n for n in ("BatchCoordinator.recover_all", "plan_batches()", "core/ledger/batches.py",
                        "core.states.BatchStates", "ParquetSpek") if missing(n)] == [
        "BatchCoordinator.recover_all", "plan_batches()", "core/ledger/batches.py", "core.states.BatchStates",
        "ParquetSpek"]


def test_the_rooms_import_only_what_the_page_allows():
    rows = doc_table(DOC, "room")
    allowed = {room(name): {room(a) for a in _CODE.findall(row[2])}
               for row in rows for name in _CODE.findall(row[0])}
    actual = folder_graph(internal_graph())
    assert sorted(set(actual) - set(allowed)) == [], "rooms the page does not list"
    assert {r: sorted(targets - allowed[r]) for r, targets in actual.items() if targets - allowed[r]} == {}


def test_every_crash_point_has_its_row():
    rows = doc_table(DOC, "point")
    assert [row[0].strip("`") for row in rows] == list(POINTS)
