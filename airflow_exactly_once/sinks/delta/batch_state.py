"""What a Delta table and its folder hold of one batch: the attempt that published it, the files of it the table reads
now, its write attempts' staged folders, and which of a committable's staged files are gone.

Reads only, apart from the commits that change them (sinks.delta.table_commits): the sink's committer asks them
before it publishes, withdraws or drops anything, and again when it checks a committable (verify_staged).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.sinks.delta import commits
from airflow_exactly_once.sinks.delta.committable import StagedFiles
from airflow_exactly_once.sinks.delta.folder import TableFolder


def published_attempt(table: Any, batch: Batch) -> int | None:
    """The epoch of the attempt whose files published `batch`, None when the table holds no commit of it."""
    return table.transaction_version(commits.app_id(batch.pipeline_id, batch.seq))


def live_files(table: Any, batch: Batch) -> dict[str, dict[str, Any]]:
    """The files of `batch` the table reads now, by their path relative to the table's folder (as staged)."""
    prefix = commits.batch_prefix(batch.pipeline_id, batch.seq)
    rows = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    return {unquote(row["path"]): row for row in rows if unquote(row["path"]).startswith(prefix)}


def missing_files(folder: TableFolder, staged: StagedFiles) -> list[str]:
    """The staged files of `staged` that are no longer in the table's folder."""
    present = set(folder.files(staged.folder)) if staged.files else set()
    return [f for f in staged.files if f not in present]


def attempt_folders(folder: TableFolder, batch: Batch) -> list[str]:
    """The folders of `batch`'s write attempts, relative to the table's folder."""
    parent, _, name = commits.batch_prefix(batch.pipeline_id, batch.seq).rpartition("/")
    return [f"{parent}/{f}" for f in folder.subfolders(parent) if f.startswith(name)]
