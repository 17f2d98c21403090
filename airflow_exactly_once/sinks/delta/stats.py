"""Delta file statistics (numRecords, minValues, maxValues, nullCount) from a staged file's Parquet footer.

Only the footer is used (its row-group statistics), never the data, and only when the file is staged
(Spark's files on a local disk: their footers read once; the object-storage writer: the FileMetaData
pyarrow wrote): the committable carries them, and the commit adds a batch's files with the statistics
Delta's data skipping uses without reading anything of the batch.
Columns whose bounds Delta does not compare, or that a footer does not give, get no bounds (Delta
then never skips on them); null counts are given for every top-level column of primitive type.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Iterable

import pyarrow.parquet as pq

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.sinks.delta.commits import partition_values
from airflow_exactly_once.sinks.delta.committable import StagedFile

# Longer strings get no bounds (Delta's own writer truncates them; no bound is always correct).
MAX_STRING_BOUND = 64


def _bound(value: Any, upper: bool) -> Any:
    """A footer's min or max as Delta's stats JSON holds it; None: leave the bound out (decimals, binary and
    booleans among them)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        return None if value != value else value  # NaN: no bound
    if isinstance(value, (int, str)):
        return None if isinstance(value, str) and len(value) > MAX_STRING_BOUND else value
    if isinstance(value, datetime.datetime):
        # Delta keeps timestamps to the millisecond: the minimum rounded down, the maximum up.
        micros = value.microsecond % 1000
        if micros and upper:
            value += datetime.timedelta(microseconds=1000 - micros)
        value -= datetime.timedelta(microseconds=value.microsecond % 1000)
        if value.tzinfo is None:
            return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}"
        utc = value.astimezone(datetime.timezone.utc)
        return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
    if isinstance(value, datetime.date):
        return value.isoformat()
    return None


def file_stats(metadata: Any) -> str:
    """The stats JSON of one Parquet file from its footer (a pyarrow FileMetaData)."""
    columns: dict[str, dict[str, Any]] = {}
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            if "." in chunk.path_in_schema:  # a nested field: no stats (Delta then never skips on it)
                continue
            seen = columns.setdefault(chunk.path_in_schema, {"nulls": 0, "min": [], "max": [], "known": True})
            statistics = chunk.statistics
            if statistics is None:
                seen["known"] = False
                continue
            seen["nulls"] += statistics.null_count or 0
            if statistics.has_min_max:
                seen["min"].append(_bound(statistics.min, False))
                seen["max"].append(_bound(statistics.max, True))
            elif statistics.null_count != chunk.num_values:
                seen["known"] = False
    stats: dict[str, Any] = {"numRecords": metadata.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for name, seen in columns.items():
        if not seen["known"]:
            continue
        stats["nullCount"][name] = seen["nulls"]
        lows, highs = seen["min"], seen["max"]
        if lows and None not in lows and None not in highs:
            stats["minValues"][name] = min(lows)
            stats["maxValues"][name] = max(highs)
    return json.dumps(stats, separators=(",", ":"))


def null_counts(metadata: Any, columns: Iterable[str]) -> dict[str, int]:
    """Nulls per top-level column of `columns` from a footer (a pyarrow FileMetaData): the NOT NULL check."""
    wanted = set(columns)
    counts: dict[str, int] = {}
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            if chunk.path_in_schema in wanted and chunk.statistics is not None:
                counts[chunk.path_in_schema] = counts.get(chunk.path_in_schema, 0) + (chunk.statistics.null_count or 0)
    return counts


def refuse_nulls(nulls: dict[str, int], table: str) -> None:
    """ConfigurationError when staged files hold nulls in the table's NOT NULL columns (`nulls`: per column)."""
    broken = {c: n for c, n in nulls.items() if n}
    if broken:
        raise ConfigurationError(f"the transform's output has nulls in NOT NULL columns of the Delta table {table}: "
                                 f"{broken} (records with a null there); filter them out or fill them in the transform")


def described(path: str, size: int, modified_ms: int, metadata: Any,
              values: dict[str, str | None]) -> StagedFile:
    """A staged file as its add action needs it, from its footer."""
    return StagedFile(path, size, metadata.num_rows, file_stats(metadata), tuple(values.items()), modified_ms)


def local_staged_file(root: Path, relative: str, attempt_folder: str, partitions: list[str],
                      metadata: Any = None) -> StagedFile:
    """A file Spark staged on a local disk (its partition values from its Hive folders), from its footer."""
    path = root / relative
    status = path.stat()
    values = partition_values(relative[len(attempt_folder) + 1:], partitions)
    return described(relative, status.st_size, int(status.st_mtime * 1000),
                     metadata if metadata is not None else pq.read_metadata(path), values)
