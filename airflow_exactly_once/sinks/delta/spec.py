"""The Delta Lake sink's settings, declared once (docs table, unknown keys, dead-letter default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from airflow_exactly_once.core.declaration import SinkSpec, argument
from airflow_exactly_once.sinks.storage_variant import ObjectStorageVariant


@dataclass(kw_only=True)
class DeltaSpec(ObjectStorageVariant, SinkSpec):
    """A key of the spec per field, after the sink type, its folder (for the placement warning) and its two sides."""

    type_name = "delta"
    local_folder_keys = ("path",)
    shared_storage = ("object storage (an s3:// path with an aws_conn_id), or a folder every worker mounts at the same "
                      "path")
    writer_class = "airflow_exactly_once.sinks.delta.sink_writer:DeltaSinkWriter"
    committer_class = "airflow_exactly_once.sinks.delta.sink_committer:DeltaSinkCommitter"
    # An s3:// (or s3a://) path: staged by pyarrow partition writers, committed by delta-rs on S3 (same committer).
    variant_classes = {"s3": ("airflow_exactly_once.sinks.delta.s3_sink_writer:S3DeltaSinkWriter",
                              "airflow_exactly_once.sinks.delta.sink_committer:DeltaSinkCommitter")}

    path: str = argument(doc="The Delta table's folder (its `_delta_log` is there or is created there): an absolute "
                             "local path, or object storage `s3://bucket/prefix/table` (`s3a://` too)")
    aws_conn_id: str | None = argument(None, "An s3:// path: the Airflow `aws` connection (login = access key id, "
                                             "password = secret access key; extras `endpoint_url`, `region_name`, "
                                             "`aws_session_token`), read by the writer and by delta-rs",
                                       shown_default="the worker's own AWS credentials (environment, instance role)")
    single_writer: bool = argument(False, "An s3:// path on a store that does not honour conditional writes "
                                          "(`If-None-Match`): declare that only one commit at a time ever reaches "
                                          "the table (no parallel interval batches, no other writer); without it "
                                          "such a store is refused at plan time",
                                   shown_default="`False`: the store's conditional writes keep commits apart")
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
        folders), created on its first write, in the same storage."""
        given = {key: spec[key] for key in ("aws_conn_id", "single_writer") if spec.get(key) is not None}
        return {"type": "delta", "path": f"{str(spec['path']).rstrip('/')}/_dead_letter", "create_table": True,
                **given}
