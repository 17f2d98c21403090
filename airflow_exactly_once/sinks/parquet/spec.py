"""The Parquet sink's settings, declared once (docs table, unknown keys, dead-letter default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from airflow_exactly_once.core.declaration import SinkSpec, argument


# [START sink_classes]
@dataclass(kw_only=True)
class ParquetSpec(SinkSpec):
    type_name = "parquet"
    writer_class = "airflow_exactly_once.sinks.parquet.sink_writer:ParquetSinkWriter"
    committer_class = "airflow_exactly_once.sinks.parquet.sink_committer:ParquetSinkCommitter"
    # [END sink_classes]
    local_folder_keys = ("path",)
    shared_storage = ("a folder every worker mounts at the same path (a shared volume, NFS; not object storage: "
                      "publishing is a rename)")

    path: str = argument(doc="The output folder, on a local or mounted file system; one path belongs to one "
                             "pipeline")

    @classmethod
    def dead_letter_beside(cls, spec: Mapping[str, Any]) -> dict[str, Any]:
        """A `_dead_letter` folder under the output (readers skip `_` folders)."""
        return {"type": "parquet", "path": f"{str(spec['path']).rstrip('/')}/_dead_letter"}
