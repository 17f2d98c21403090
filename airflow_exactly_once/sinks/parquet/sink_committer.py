"""The Parquet sink's committer: a staged folder is published by one atomic rename (the layout:
sinks.parquet.layout)."""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError, TransactionLostError
from airflow_exactly_once.core.lineage_names import DatasetName, file_dataset
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.sinks.parquet.committable import StagedFolder
from airflow_exactly_once.sinks.parquet.layout import ParquetLayout
from airflow_exactly_once.sinks.parquet.spec import ParquetSpec


# [START committer_class]
class ParquetSinkCommitter(SinkCommitter[StagedFolder]):
    spec_type = ParquetSpec
    supports_retract = True
    committable_type = StagedFolder

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.layout = ParquetLayout(spec)  # the folders, shared with the writer (sinks/parquet/layout.py)
    # [END committer_class]

    def lineage_dataset(self) -> DatasetName:
        return file_dataset(str(self.layout.root))

    def check(self, pipeline_id: str) -> None:
        owner = self.layout.root / "_pipeline"
        try:
            self.layout.root.mkdir(parents=True, exist_ok=True)
            if owner.exists() and owner.read_text().strip() != pipeline_id:
                raise ConfigurationError(
                    f"{self.layout.root} belongs to pipeline {owner.read_text().strip()!r}; give pipeline "
                    f"{pipeline_id!r} its own output path")
            if not owner.exists():
                owner.write_text(pipeline_id)
        except PermissionError as exc:
            raise ConfigurationError(f"cannot write to the parquet sink path {self.layout.root}: {exc}") from exc

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
        final = self.layout.final_dir(batch)
        self.layout.manifest_entry(batch).unlink(missing_ok=True)
        if not final.exists():
            return f"batch_seq={batch.seq} was already withdrawn"
        trash = self.layout.root / "_retracted" / f"{final.name}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S%f}"
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
        folder = self.layout.root / "_staging"
        leftovers = list(folder.glob(f"batch-{batch.seq:09d}-*")) if folder.exists() else []
        for path in leftovers:
            shutil.rmtree(path, ignore_errors=True)
        return len(leftovers)

    def _write_manifest(self, batch: Batch, committable: StagedFolder) -> None:
        entry = self.layout.manifest_entry(batch)
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
