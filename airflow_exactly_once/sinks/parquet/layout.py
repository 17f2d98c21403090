"""Where the Parquet sink keeps what, under its `path` (the writer stages there, the committer publishes):

  batch_seq=<n>/            committed output of batch n (a partition column for readers)
  _staging/batch-<n>-e<epoch>/   output of one write attempt, invisible to readers
  _manifest/batch-<n>.json  one entry per committed batch: ranges, files, records
  _retracted/               output being withdrawn (rewind, interval replacement), then deleted
  _pipeline                 the pipeline that owns the folder (two pipelines must not share it)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.model import Batch


def _local_path(path: str) -> Path:
    if path.startswith("file://"):
        path = path[len("file://"):]
    if "://" in path:
        raise ConfigurationError(  # object storage has its own layout (sinks/parquet/s3/), chosen by the spec
            f"parquet sink path {path!r} is not a local or mounted folder: this layout publishes with an atomic rename")
    if not os.path.isabs(path):
        raise ConfigurationError(f"parquet sink path {path!r} must be absolute (tasks run in other directories)")
    return Path(path)


class ParquetLayout:
    """The folders of one Parquet sink spec."""

    def __init__(self, spec: dict[str, Any]) -> None:
        if not spec.get("path"):
            raise ConfigurationError("the parquet sink needs a 'path', e.g. {'type': 'parquet', 'path': '/data/out'}")
        self.root = _local_path(spec["path"])

    def final_dir(self, batch: Batch) -> Path:
        return self.root / f"batch_seq={batch.seq}"

    def staging_dir(self, batch: Batch) -> Path:
        """One folder per write attempt (the epoch of its claim)."""
        return self.root / "_staging" / f"batch-{batch.seq:09d}-e{batch.epoch}"

    def manifest_entry(self, batch: Batch) -> Path:
        return self.root / "_manifest" / f"batch-{batch.seq:09d}.json"
