"""How a batch shows in a Delta table, and the decisions the committer takes from it.

Pure logic over plain values (no delta-rs, no Spark), so each rule has a unit test:

* a write attempt stages its Parquet files in a folder of its own inside the table's folder,
  `_aeo_staging/<pipeline>/batch-<seq>-e<epoch>/` (Delta readers read only the files the log adds,
  and VACUUM leaves `_` folders alone), partitioned Hive-style (`day=2024-05-01/`) below it;
* the commit adds those files where they are and carries the application transaction
  (txn) `aeo:<pipeline>:<seq>` with the attempt's epoch as its version: a batch is published
  when the table holds that transaction, and the version says which attempt's folder is live;
* a table is written only when the committer writes every table feature it has correctly.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Iterable, Mapping
from urllib.parse import quote, unquote

STAGING = "_aeo_staging"
BATCH = "aeo.batch"
PIPELINE = "aeo.pipeline"
SEQ = "aeo.batch-seq"
ATTEMPT = "aeo.attempt"
RUN = "aeo.run-id"
REPLACES = "aeo.replaces"
RETRACTS = "aeo.retracts"
# Spark's name of a null partition value in a Hive-style folder.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
# Partition column types whose Hive folder text is the Delta partition value as it is.
PARTITION_TYPES = ("string", "long", "integer", "short", "byte", "boolean", "date")


def batch_key(pipeline_id: str, seq: int) -> str:
    return f"{pipeline_id}:{seq}"


def app_id(pipeline_id: str, seq: int) -> str:
    """The batch's application transaction id: one per batch, since parallel interval batches commit in any order
    and Delta keeps only the newest version of an id."""
    return f"aeo:{pipeline_id}:{seq}"


def batch_prefix(pipeline_id: str, seq: int) -> str:
    """What the folders of every write attempt of a batch start with, relative to the table's folder."""
    return f"{STAGING}/{pipeline_id}/batch-{seq:09d}-e"


def attempt_folder(pipeline_id: str, seq: int, epoch: int) -> str:
    """One write attempt's folder, relative to the table's folder (the epoch of its claim tells attempts apart)."""
    return f"{batch_prefix(pipeline_id, seq)}{epoch}"


def commit_metadata(pipeline_id: str, seq: int, epoch: int, run_id: str) -> dict[str, str]:
    """The commitInfo entries of the commit that publishes (or replaces with) this batch, for people reading the
    table's history."""
    return {BATCH: batch_key(pipeline_id, seq), PIPELINE: pipeline_id, SEQ: str(seq), ATTEMPT: str(epoch),
            RUN: run_id}


def partition_values(path_in_attempt: str, columns: Iterable[str]) -> dict[str, str | None]:
    """The Delta partition values of a staged file from its Hive-style folders (`day=2024-05-01/part-0.parquet`),
    as Spark escaped them; ValueError when a column's folder is missing."""
    found: dict[str, str | None] = {}
    for segment in path_in_attempt.split("/")[:-1]:
        name, sep, text = segment.partition("=")
        if sep:
            value = unquote(text)
            found[unquote(name)] = None if value == HIVE_NULL else value
    wanted = list(columns)
    missing = [c for c in wanted if c not in found]
    if missing:
        raise ValueError(f"staged file {path_in_attempt} has no folder for partition column(s) {missing}")
    return {c: found[c] for c in wanted}


def partition_text(value: Any) -> str | None:
    """A partition column's value as Delta's log holds it (and Spark's Hive folder shows it): None for a null."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def hive_folder(values: Mapping[str, str | None]) -> str:
    """The Hive-style folders of a file with these partition values ("day=2024-05-01/", nulls as Spark names them),
    escaped so that `partition_values` reads them back."""
    return "".join(f"{quote(column, safe=' ')}={HIVE_NULL if text is None else quote(text, safe=' ')}/"
                   for column, text in values.items())


def partition_type_problems(columns: Iterable[str], types: Mapping[str, Any]) -> list[str]:
    """Partition columns whose type the sink cannot stage (its Hive folder text is not the Delta value)."""
    return [f"{c} ({types.get(c)})" for c in columns if types.get(c) not in PARTITION_TYPES]


# -- table features ---------------------------------------------------------------

# Writer features the committer writes correctly whatever the table does with them.
WRITTEN_FEATURES = frozenset({"appendOnly", "changeDataFeed", "timestampNtz"})
# Features that need nothing of a writer while the table does not use them (what it then needs, the reason).
UNUSED_FEATURES = {
    "invariants": "a column has a NOT NULL or CHECK invariant (delta.invariants)",
    "checkConstraints": "the table has CHECK constraints (delta.constraints.*)",
    "generatedColumns": "a column is generated (delta.generationExpression)",
    "columnMapping": "column mapping is on (delta.columnMapping.mode): data files use physical column names",
    "identityColumns": "a column is an identity column (delta.identity.*)",
}
# The features the legacy protocol versions (before table features, writer version 7) imply.
LEGACY_WRITER_FEATURES = {2: ("appendOnly", "invariants"), 3: ("checkConstraints",),
                          4: ("changeDataFeed", "generatedColumns"), 5: ("columnMapping",), 6: ("identityColumns",)}


@dataclass(frozen=True)
class TableFeatures:
    """What a table's protocol and metadata say about the features a writer must honour."""

    min_reader_version: int
    min_writer_version: int
    reader_features: tuple[str, ...] = ()
    writer_features: tuple[str, ...] = ()
    configuration: Mapping[str, str | None] = None  # type: ignore[assignment]
    column_metadata_keys: frozenset[str] = frozenset()  # every key of every column's metadata, nested ones too

    def writer_feature_names(self) -> list[str]:
        if self.min_writer_version >= 7:
            return list(self.writer_features)
        return [f for version, names in LEGACY_WRITER_FEATURES.items() if version <= self.min_writer_version
                for f in names]

    def in_use(self, feature: str) -> bool:
        config = self.configuration or {}
        keys = self.column_metadata_keys
        if feature == "invariants":
            return "delta.invariants" in keys
        if feature == "checkConstraints":
            return any(k.startswith("delta.constraints.") for k in config)
        if feature == "generatedColumns":
            return "delta.generationExpression" in keys
        if feature == "columnMapping":
            return (config.get("delta.columnMapping.mode") or "none") != "none"
        if feature == "identityColumns":
            return any(k.startswith("delta.identity.") for k in keys)
        return True


def unwritable_features(table: TableFeatures) -> list[str]:
    """The features of `table` the committer cannot honour, each with why; empty: the sink can write it."""
    problems = []
    for feature in table.writer_feature_names():
        if feature in WRITTEN_FEATURES:
            continue
        if feature in UNUSED_FEATURES:
            if table.in_use(feature):
                problems.append(f"{feature}: {UNUSED_FEATURES[feature]}")
            continue
        problems.append(f"{feature}: not written by delta-rs or by Spark's Parquet writer")
    if table.min_reader_version >= 3:
        readable = WRITTEN_FEATURES | {f for f in UNUSED_FEATURES if not table.in_use(f)}
        problems += [f"{f}: a reader feature delta-rs cannot read" for f in table.reader_features
                     if f not in readable and f not in table.writer_features]
    return problems


# -- schemas ----------------------------------------------------------------------

def _plain(data_type: Any) -> Any:
    """A Delta/Spark JSON type without nullability or metadata, for comparing types only."""
    if isinstance(data_type, dict):
        return {k: _plain(v) for k, v in data_type.items()
                if k not in ("nullable", "containsNull", "valueContainsNull", "metadata")}
    if isinstance(data_type, list):
        return [_plain(v) for v in data_type]
    return data_type


def schema_problems(table_fields: list[dict[str, Any]], frame_fields: list[dict[str, Any]]) -> list[str]:
    """How the transform's output (Spark's JSON schema fields) differs from the table's (Delta's, the same JSON):
    names compared as Delta compares them (case-insensitively), types exactly."""
    table = {f["name"].lower(): f for f in table_fields}
    given = {f["name"].lower(): f for f in frame_fields}
    problems = [f"column {given[c]['name']} is not in the table" for c in given if c not in table]
    problems += [f"column {table[c]['name']} is missing" for c in table if c not in given]
    for name in given.keys() & table.keys():
        want, got = _plain(table[name]["type"]), _plain(given[name]["type"])
        if want != got:
            problems.append(f"column {table[name]['name']} is {_shown(got)} in the output, {_shown(want)} in the "
                            "table")
    return problems


def _shown(data_type: Any) -> str:
    return data_type if isinstance(data_type, str) else str(data_type.get("type", data_type))


def not_null_columns(table_fields: list[dict[str, Any]]) -> list[str]:
    """Top-level columns the table declares NOT NULL."""
    return [f["name"] for f in table_fields if f.get("nullable") is False]


# -- withdrawing a batch -----------------------------------------------------------

def withdrawable(batch_files: set[str], live_files: set[str]) -> set[str] | None:
    """The files a retraction of a batch that published `batch_files` removes now: those still live (none:
    withdrawn before, or never published). None when only some are live: compaction rewrote the others into files
    that hold other batches' rows too, so no exact withdrawal exists."""
    live = batch_files & live_files
    return live if not live or live == batch_files else None


# -- files of withdrawn batches ------------------------------------------------------
#
# VACUUM leaves `_` folders alone, so the sink deletes the folders of batches it withdrew itself, as VACUUM would
# delete their files: once the commit that removed them is older than the table's deletedFileRetentionDuration
# (time travel to before it keeps working that long). The time of that commit is kept in a marker of the
# pipeline's own, written right after it: the log's tombstones cannot tell it, since checkpoints drop them exactly
# when the retention has passed.

WITHDRAWN = "_withdrawn"  # beside the pipeline's attempt folders: one marker per withdrawn folder
RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
DEFAULT_RETENTION = "interval 1 week"  # Delta's default
_UNIT_MS = {"nanosecond": 1e-6, "microsecond": 1e-3, "millisecond": 1, "second": 1000, "minute": 60_000,
            "hour": 3_600_000, "day": 86_400_000, "week": 604_800_000}


def withdrawn_marker(pipeline_id: str, folder: str) -> str:
    """The marker of a withdrawn attempt folder, relative to the table's folder."""
    return f"{STAGING}/{pipeline_id}/{WITHDRAWN}/{folder.rsplit('/', 1)[-1]}.json"


def folder_of(path: str, pipeline_id: str, seq: int) -> str:
    """The attempt folder a staged file of batch `seq` lies in (relative paths, as the log names the file)."""
    prefix = batch_prefix(pipeline_id, seq)
    if not path.startswith(prefix):
        raise ValueError(f"{path} is not a staged file of batch {seq} of {pipeline_id}")
    return prefix + path[len(prefix):].split("/", 1)[0]


def interval_ms(text: str | None) -> int | None:
    """A Delta interval property ("interval 1 week", "2 days", "interval 1 day 12 hours") in milliseconds; None when
    it is not one (months and years are not: Delta refuses them for retention too)."""
    words = (text or "").strip().lower().split()
    if words[:1] == ["interval"]:
        words = words[1:]
    if not words or len(words) % 2:
        return None
    total = 0.0
    for number, unit in zip(words[::2], words[1::2]):
        factor = _UNIT_MS.get(unit.removesuffix("s"))
        try:
            value = float(number)
        except ValueError:
            return None
        if factor is None or value < 0:
            return None
        total += value * factor
    return int(total)


def deleted_file_retention_ms(configuration: Mapping[str, str | None]) -> int | None:
    """How long the table keeps the files a commit removed (for time travel), from its properties; None when the
    property is not an interval (then the sink deletes nothing)."""
    return interval_ms(configuration.get(RETENTION_PROPERTY) or DEFAULT_RETENTION)


def expired_withdrawals(withdrawn_at_ms: Mapping[str, int], live_folders: set[str], now_ms: int,
                        retention_ms: int | None) -> list[str]:
    """The withdrawn attempt folders whose files may go now: withdrawn longer ago than the retention, and holding no
    file the table reads (a folder the table reads again is never deleted, whatever its marker says)."""
    if retention_ms is None:
        return []
    return sorted(folder for folder, at in withdrawn_at_ms.items()
                  if at + retention_ms < now_ms and folder not in live_folders)
