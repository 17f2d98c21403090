"""The package's import graph: no cycles (function-local imports included), no dev tooling,
and a protocol core free of Airflow and PySpark."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_exactly_once"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported_names(node: ast.AST) -> set[str]:
    """The modules (and names in them) one import statement names; nothing for other nodes."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return set()


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (function-local imports count)."""
    return {name for node in ast.walk(ast.parse(path.read_text())) for name in imported_names(node)}


def internal_graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        targets = {t for t in imports_of(path) if t in MODULES and t != name}
        # Importing a.b.c runs a/__init__ and a/b/__init__ too; only our own modules count as edges.
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    assert cycles(internal_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_production_code_never_imports_dev_tooling_or_tests():
    offenders = {name: sorted(t for t in imports_of(path) if t.split(".")[0] in ("devtools", "tests", "benchmarks"))
                 for name, path in MODULES.items()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_protocol_core_imports_neither_airflow_nor_pyspark():
    core = {name: sorted(t for t in imports_of(path) if t.split(".")[0] in ("airflow", "pyspark"))
            for name, path in MODULES.items() if name.startswith("airflow_exactly_once.core")}
    assert {k: v for k, v in core.items() if v} == {}


def unit_of(module: str) -> str:
    """The folder (or top-level module) of the package a module lives in: `core`, `sinks`, `task_group`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which folders import which: the module graph with every module replaced by its folder."""
    folders: dict[str, set[str]] = {unit_of(name): set() for name in graph}
    for name, targets in graph.items():
        folders[unit_of(name)].update(unit_of(t) for t in targets if unit_of(t) != unit_of(name))
    return folders


def test_no_import_loops_between_folders():
    loops = cycles(folder_graph(internal_graph()))
    edges = {f"{a} -> {b}" for a, targets in internal_graph().items() for b in targets
             if any(unit_of(a) in loop and unit_of(b) in loop for loop in loops) and unit_of(a) != unit_of(b)}
    assert loops == [], f"folders importing each other: {loops}, through {sorted(edges)}"


def test_the_folder_loop_check_finds_a_loop_through_modules():
    graph = {"p.spark.write_job": {"p.sinks"}, "p.sinks": set(), "p.sinks.iceberg": {"p.spark.packages"},
             "p.spark.packages": set(), "p.core.model": set()}
    assert cycles(folder_graph(graph)) == [["sinks", "spark"]]


def test_the_protocol_core_imports_nothing_else_of_the_package():
    outside = {name: sorted(t for t in targets if unit_of(t) != "core")
               for name, targets in internal_graph().items() if unit_of(name) == "core"}
    assert {k: v for k, v in outside.items() if v} == {}


def module_level_imports(path: Path) -> set[str]:
    """What importing `path` imports: statements outside functions (class bodies run on import too), without the
    `if TYPE_CHECKING:` blocks."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            found.update(imported_names(child))
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def loaded_on_import(module: str) -> set[str]:
    """The top-level packages outside ours that importing `module` loads (through our modules' module-level
    imports, and the packages' __init__ files that importing a module runs)."""
    seen, outside, todo = set(), set(), [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in MODULES)
        for target in module_level_imports(MODULES[name]):
            if target in MODULES:
                todo.append(target)
            elif target.split(".")[0] != "airflow_exactly_once":
                outside.add(target.split(".")[0])
    return outside


def test_a_dag_that_uses_the_task_group_loads_neither_kafka_python_nor_pyspark():
    """Airflow imports the DAG file in every task: the plan step alone needs kafka-python, the write step alone a
    Spark client; each imports them when it runs (about 0.2 s of every other task's start, kafka-python alone)."""
    outside = loaded_on_import("airflow_exactly_once.task_group")
    assert "airflow" in outside  # the walk reaches the operators
    assert not outside & {"kafka", "pyspark", "confluent_kafka", "pyiceberg", "psycopg2"}, sorted(outside)


def test_the_airflow_integration_knows_no_sink_spark_or_kafka():
    """airflow_integration/ ties the package to Airflow; what it needs of the sinks (folders, datasets) its callers
    hand in, so the sinks, which use its connections, are never imported back. The package's version (a module that
    imports nothing) and the ledger's read models it may read."""
    outside = {name: sorted(t for t in targets if unit_of(t) not in ("core", "observe", "airflow_integration",
                                                                       "version"))
               for name, targets in internal_graph().items() if unit_of(name) == "airflow_integration"}
    assert {k: v for k, v in outside.items() if v} == {}


def test_the_read_models_import_only_the_protocol_core():
    """observe/ (backlog, drift, audit) reads the ledger for the UI, the triggers, the CLI and the metrics: it sits
    right above core, so every room that shows the ledger may use it and it never pulls a client or a sink in."""
    outside = {name: sorted(t for t in targets if unit_of(t) not in ("core", "observe"))
               for name, targets in internal_graph().items() if unit_of(name) == "observe"}
    assert {k: v for k, v in outside.items() if v} == {}


def test_the_cli_knows_no_sink():
    """Each sink adds its own commands (its declaration's `commands`, sinks.commands.CommandTools): the CLI imports
    the sink registry and that contract, never a sink's package."""
    inside = {name: sorted(t for t in targets if t.startswith("airflow_exactly_once.sinks.")
                           and t != "airflow_exactly_once.sinks.commands")
              for name, targets in internal_graph().items() if unit_of(name) == "cli"}
    assert {k: v for k, v in inside.items() if v} == {}
