"""Parquet files: staged in a folder Spark readers ignore, published by one atomic rename.

Layout under `path`:
  batch_seq=<n>/            committed output of batch n (a partition column for readers)
  _staging/batch-<n>-<attempt>/   output of one write attempt, invisible to readers
  _manifest/batch-<n>.json  one entry per committed batch: ranges, files, records
  _retracted/               output being withdrawn (rewind, interval replacement), then deleted
  _pipeline                 the pipeline that owns the folder (two pipelines must not share it)
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError, TransactionLostError
from airflow_exactly_once.core.lineage_names import DatasetName, file_dataset
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import Committable, Handles, RunWriters, Sink
from airflow_exactly_once.sinks.parquet.spec import ParquetSpec


def _local_path(path: str) -> Path:
    if path.startswith("file://"):
        path = path[len("file://"):]
    if "://" in path:
        raise ConfigurationError(
            f"parquet sink path {path!r}: only local or shared (mounted) file systems are supported, because "
            "publishing relies on an atomic rename; mount the storage or use another sink")
    if not os.path.isabs(path):
        raise ConfigurationError(f"parquet sink path {path!r} must be absolute (tasks run in other directories)")
    return Path(path)


@dataclass(frozen=True)
class StagedFolder(Committable):
    """One write attempt's files: where they are staged and where they get published."""

    staging: str
    final: str
    files: tuple[str, ...] = ()

    handles_version = 1

    def write_handles(self) -> Handles:
        return {"staging": self.staging, "final": self.final, "files": list(self.files)}

    @classmethod
    def read_handles_v1(cls, handles: Handles) -> "StagedFolder":
        return cls(str(handles["staging"]), str(handles["final"]), tuple(handles.get("files", ())))


class ParquetSink(Sink):
    """Staged by Spark's own Parquet writer (no partition writer of ours: it is as fast as plain Spark)."""

    spec_type = ParquetSpec
    supports_retract = True
    splits_reads = True  # one staged folder, however many Spark partitions wrote it
    committable_type = StagedFolder

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        if not spec.get("path"):
            raise ConfigurationError("the parquet sink needs a 'path', e.g. {'type': 'parquet', 'path': '/data/out'}")
        self.root = _local_path(spec["path"])

    # -- names ---------------------------------------------------------------------

    def lineage_dataset(self) -> DatasetName:
        return file_dataset(str(self.root))

    def final_dir(self, batch: Batch) -> Path:
        return self.root / f"batch_seq={batch.seq}"

    def staging_dir(self, batch: Batch) -> Path:
        """One folder per write attempt (the epoch of its claim)."""
        return self.root / "_staging" / f"batch-{batch.seq:09d}-e{batch.epoch}"

    def manifest_entry(self, batch: Batch) -> Path:
        return self.root / "_manifest" / f"batch-{batch.seq:09d}.json"

    # -- protocol ------------------------------------------------------------------

    def check(self, pipeline_id: str) -> None:
        owner = self.root / "_pipeline"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            if owner.exists() and owner.read_text().strip() != pipeline_id:
                raise ConfigurationError(
                    f"{self.root} belongs to pipeline {owner.read_text().strip()!r}; give pipeline "
                    f"{pipeline_id!r} its own output path")
            if not owner.exists():
                owner.write_text(pipeline_id)
        except PermissionError as exc:
            raise ConfigurationError(f"cannot write to the parquet sink path {self.root}: {exc}") from exc

    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> StagedFolder:
        staging = self.staging_dir(batch)
        try:
            frame.write.mode("overwrite").parquet(str(staging))
        except Exception:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        files = tuple(sorted(p.name for p in staging.glob("*.parquet")))
        return StagedFolder(str(staging), str(self.final_dir(batch)), files)

    # [START committer]
    def verify_staged(self, batch: Batch, committable: StagedFolder) -> None:
        if not Path(committable.final).exists() and not Path(committable.staging).exists():
            raise TransactionLostError(f"the staged output {committable.staging} of batch {batch.seq} is gone and "
                                       "was never published", sink=self.type_name, batch=batch.seq,
                                       lost=[committable.staging], reason="the staged folder was removed")

    def commit(self, batch: Batch, committable: StagedFolder) -> str:
        self.verify_staged(batch, committable)
        staging, final = Path(committable.staging), Path(committable.final)
        if final.exists():
            outcome = "output was already published"
        else:
            os.rename(staging, final)  # atomic: readers see all of the batch or none of it
            outcome = f"published {final.name}"
        self._write_manifest(batch, committable)
        self._remove_staging(batch)  # leftovers of attempts that were fenced or killed
        return outcome

    def abort(self, batch: Batch, committable: StagedFolder | None) -> str:
        if committable is not None:
            shutil.rmtree(committable.staging, ignore_errors=True)
            return f"removed {committable.staging}"
        removed = self._remove_staging(batch)
        return f"removed {removed} staged attempt(s) of batch {batch.seq}"
    # [END committer]

    def retract(self, batch: Batch, committable: StagedFolder | None) -> str:
        """Withdraw a committed batch: one rename hides it from readers, then it is deleted."""
        final = self.final_dir(batch)
        self.manifest_entry(batch).unlink(missing_ok=True)
        if not final.exists():
            return f"batch_seq={batch.seq} was already withdrawn"
        trash = self.root / "_retracted" / f"{final.name}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S%f}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.rename(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
        return f"withdrew {final.name}"

    def commit_replacing(self, batch: Batch, committable: StagedFolder, replaced: Batch) -> str:
        """Hide the old batch, then publish the new one: readers never see both at once."""
        self.verify_staged(batch, committable)
        withdrawn = self.retract(replaced, None)
        return f"{withdrawn}; {self.commit(batch, committable)} in its place"

    # -- helpers -------------------------------------------------------------------

    def _remove_staging(self, batch: Batch) -> int:
        folder = self.root / "_staging"
        leftovers = list(folder.glob(f"batch-{batch.seq:09d}-*")) if folder.exists() else []
        for path in leftovers:
            shutil.rmtree(path, ignore_errors=True)
        return len(leftovers)

    def _write_manifest(self, batch: Batch, committable: StagedFolder) -> None:
        entry = self.manifest_entry(batch)
        entry.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "pipeline_id": batch.pipeline_id,
            "batch_seq": batch.seq,
            "run_id": batch.run_id,
            "ranges": [r.__dict__ for r in batch.ranges],
            "files": list(committable.files),
            "input_records": batch.input_records,
            "output_records": batch.output_records,
            "published_at": datetime.now(timezone.utc).isoformat(),
        }
        tmp = entry.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=1, default=str))
        os.replace(tmp, entry)
