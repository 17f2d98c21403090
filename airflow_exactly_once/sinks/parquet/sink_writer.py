"""The Parquet sink's writer: Spark's own Parquet writer stages a batch in a folder readers ignore."""

from __future__ import annotations

import shutil
from typing import Any

from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import RunWriters
from airflow_exactly_once.core.sink_writer import SinkWriter
from airflow_exactly_once.sinks.parquet.committable import StagedFolder
from airflow_exactly_once.sinks.parquet.layout import ParquetLayout
from airflow_exactly_once.sinks.parquet.spec import ParquetSpec


# [START writer]
class ParquetSinkWriter(SinkWriter):
    """Staged by Spark's own Parquet writer (no partition writer of ours: it is as fast as plain Spark)."""

    spec_type = ParquetSpec
    splits_reads = True  # one staged folder, however many Spark partitions wrote it

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.layout = ParquetLayout(spec)

    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> StagedFolder:
        staging = self.layout.staging_dir(batch)
        try:
            frame.write.mode("overwrite").parquet(str(staging))
        except Exception:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        files = tuple(sorted(p.name for p in staging.glob("*.parquet")))
        return StagedFolder(str(staging), str(self.layout.final_dir(batch)), files)
# [END writer]
