"""Eyes on a Delta table in tests: its rows as delta-rs (pyarrow) reads them, and what is staged but not live."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable

from airflow_exactly_once.sinks.delta.commits import STAGING


def delta_rows(root: Path, column: str | None = None, version: int | None = None) -> list[Any]:
    """The table's rows (a column's values, or whole rows as dicts) as delta-rs reads them; none without a table."""
    if not (root / "_delta_log").is_dir():
        return []
    table = DeltaTable(str(root), version=version).to_pyarrow_table()
    return table.column(column).to_pylist() if column else table.to_pylist()


def live_paths(root: Path) -> set[str]:
    """The files the table's newest version reads, relative to its folder."""
    if not (root / "_delta_log").is_dir():
        return set()
    return {unquote(p) for p in pa.table(DeltaTable(str(root)).get_add_actions(flatten=True)).column("path").to_pylist()}


def delta_staged(root: Path) -> list[str]:
    """Staged attempt folders (relative to the table) none of whose files the table reads: what an abort or a
    commit must have removed."""
    live = live_paths(root)
    folders = sorted(p for p in (root / STAGING).glob("*/batch-*") if p.is_dir()) if (root / STAGING).is_dir() else []
    relative = [str(p.relative_to(root)) for p in folders]
    return [f for f in relative if not any(path.startswith(f + "/") for path in live)]
