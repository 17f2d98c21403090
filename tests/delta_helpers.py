"""Eyes on a Delta table in tests: its rows as delta-rs (pyarrow) reads them, and what is staged but not live; on a
local disk, or on the tests' S3-compatible server (`root` an s3:// URL, `options` delta-rs's settings for it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from airflow_exactly_once.sinks.delta.commits import STAGING
from airflow_exactly_once.sinks.delta.object_folder import delta_storage_options
from airflow_exactly_once.storage.s3_client import S3Access


def s3_options(server: Any) -> dict[str, str]:
    """delta-rs's settings for the tests' S3-compatible server (devtools.object_storage.LocalObjectStorage)."""
    from devtools.object_storage import REGION

    return delta_storage_options(S3Access(server.endpoint_url, REGION, server.access_key, server.secret_key), True)


def _table(root: Path | str, options: dict[str, str] | None, version: int | None = None) -> DeltaTable | None:
    if isinstance(root, Path) and not (root / "_delta_log").is_dir():
        return None
    try:
        return DeltaTable(str(root), version=version, storage_options=options)
    except TableNotFoundError:
        return None


def delta_rows(root: Path | str, column: str | None = None, version: int | None = None,
               options: dict[str, str] | None = None) -> list[Any]:
    """The table's rows (a column's values, or whole rows as dicts) as delta-rs reads them; none without a table."""
    table = _table(root, options, version)
    if table is None:
        return []
    rows = table.to_pyarrow_table()
    return rows.column(column).to_pylist() if column else rows.to_pylist()


def live_paths(root: Path | str, options: dict[str, str] | None = None) -> set[str]:
    """The files the table's newest version reads, relative to its folder."""
    table = _table(root, options)
    if table is None:
        return set()
    return {unquote(p) for p in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()}


def _not_live(folders: list[str], live: set[str]) -> list[str]:
    return [f for f in sorted(folders) if not any(path.startswith(f + "/") for path in live)]


def delta_staged(root: Path) -> list[str]:
    """Staged attempt folders (relative to the table) none of whose files the table reads: what an abort or a
    commit must have removed."""
    folders = sorted(p for p in (root / STAGING).glob("*/batch-*") if p.is_dir()) if (root / STAGING).is_dir() else []
    return _not_live([str(p.relative_to(root)) for p in folders], live_paths(root))


def delta_staged_s3(client: Any, bucket: str, table_key: str, options: dict[str, str]) -> list[str]:
    """delta_staged for a table on the S3-compatible server: attempt folders (with an object or an open upload under
    them) none of whose files the table reads."""
    prefix = f"{table_key}/{STAGING}/"
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])]
    keys += [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])]
    folders = {"/".join(k[len(table_key) + 1:].split("/")[:3]) for k in keys}
    return _not_live([f for f in folders if f.split("/")[-1].startswith("batch-")],
                     live_paths(f"s3://{bucket}/{table_key}", options))
