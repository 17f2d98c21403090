"""The Delta Lake sink's settings, declared once (docs table, unknown keys, dead-letter default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from airflow_exactly_once.core.declaration import SinkSpec, argument


@dataclass(kw_only=True)
class DeltaSpec(SinkSpec):
    """A key of the spec per field, after the sink type, its folder (for the placement warning) and its two sides."""

    type_name = "delta"
    local_folder_keys = ("path",)
    shared_storage = "a folder every worker mounts at the same path (object storage comes with a later release)"
    writer_class = "airflow_exactly_once.sinks.delta.sink_writer:DeltaSinkWriter"
    committer_class = "airflow_exactly_once.sinks.delta.sink_committer:DeltaSinkCommitter"

    path: str = argument(doc="The Delta table's folder, an absolute local path (its `_delta_log` is there or is "
                             "created there)")
    create_table: bool = argument(False, "Create the table on the first write from the transform's schema (with "
                                         "delta-rs: no Spark Delta jars needed)",
                                  shown_default="`False`: a missing table is a plan-time error")
    partitioned_by: list[str] | None = argument(None, "Partition columns of a table the sink creates (string, "
                                                      "integer, boolean or date columns); an existing table keeps "
                                                      "its own")
    table_properties: dict[str, str] | None = argument(None, "Delta table properties of a table the sink creates "
                                                             "(e.g. `delta.checkpointInterval`); a property that "
                                                             "turns on a table feature the sink cannot write is "
                                                             "refused at plan time")

    @classmethod
    def dead_letter_beside(cls, spec: Mapping[str, Any]) -> dict[str, Any]:
        """A Delta table of its own in `_dead_letter` under the output's folder (Delta readers never look in `_`
        folders), created on its first write."""
        return {"type": "delta", "path": f"{str(spec['path']).rstrip('/')}/_dead_letter", "create_table": True}
