"""The Parquet sink's settings, declared once (docs table, unknown keys, dead-letter default)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from airflow_exactly_once.core.declaration import SinkSpec, argument, is_template
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.sinks.storage_variant import ObjectStorageVariant

# S3's multipart limits: every part but the last holds at least 5 MiB; a part at most 5 GiB.
PART_SIZE_MB_RANGE = (5, 5120)


# [START sink_classes]
@dataclass(kw_only=True)
class ParquetSpec(ObjectStorageVariant, SinkSpec):
    type_name = "parquet"
    writer_class = "airflow_exactly_once.sinks.parquet.sink_writer:ParquetSinkWriter"
    committer_class = "airflow_exactly_once.sinks.parquet.sink_committer:ParquetSinkCommitter"
    # [END sink_classes]
    # An s3:// (or s3a://) path: files staged as open multipart uploads, published by completing them.
    variant_classes = {"s3": ("airflow_exactly_once.sinks.parquet.s3.sink_writer:S3ParquetSinkWriter",
                              "airflow_exactly_once.sinks.parquet.s3.sink_committer:S3ParquetSinkCommitter")}
    local_folder_keys = ("path",)
    shared_storage = ("object storage (an s3:// path with an aws_conn_id), or a folder every worker mounts at the same "
                      "path (a shared volume, NFS)")

    path: str = argument(doc="The output folder: a local or mounted folder (published by a rename), or object storage "
                             "`s3://bucket/prefix` (`s3a://` too; published by completing multipart uploads); one "
                             "path belongs to one pipeline")
    aws_conn_id: str | None = argument(None, "An s3:// path: the Airflow `aws` connection (login = access key id, "
                                             "password = secret access key; extras `endpoint_url`, `region_name`, "
                                             "`aws_session_token`)",
                                       shown_default="boto3's own credentials (environment, instance role)")
    part_size_mb: int = argument(8, "An s3:// path: the size of each uploaded part in MiB (5 to 5120); a writer holds "
                                    "at most three parts in memory (one filling, two uploading)")

    @classmethod
    def check_values(cls, spec: Mapping[str, Any], *, rendered: bool = True) -> None:
        """Also the path's scheme (ObjectStorageVariant) and the part size, when the DAG is parsed."""
        super().check_values(spec, rendered=rendered)
        if spec.get("part_size_mb") not in (None, "") and not is_template(spec.get("part_size_mb")):
            part_size_bytes(spec)

    @classmethod
    def dead_letter_beside(cls, spec: Mapping[str, Any]) -> dict[str, Any]:
        """A `_dead_letter` folder under the output (readers skip `_` folders), in the same storage."""
        given = {key: spec[key] for key in ("aws_conn_id", "part_size_mb") if spec.get(key) is not None}
        return {"type": "parquet", "path": f"{str(spec['path']).rstrip('/')}/_dead_letter", **given}


def part_size_bytes(spec: Mapping[str, Any]) -> int:
    """The spec's part size in bytes, within S3's limits."""
    low, high = PART_SIZE_MB_RANGE
    size = int(spec.get("part_size_mb") or 8)
    if not low <= size <= high:
        raise ConfigurationError(f"the parquet sink's part_size_mb must be {low} to {high} (S3's part limits), "
                                 f"not {size}")
    return size * 1024 * 1024
