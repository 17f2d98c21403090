"""Where an object-storage path points: scheme, bucket and key, parsed once for every sink that writes there.

Pure parsing (no client library): the Parquet sink picks its object-storage layout from it, and the
Iceberg sink can read its warehouse with it. Only S3's schemes are supported; any other scheme is
refused naming the supported ones, so a `gs://` path fails when the DAG is checked, not in a client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_exactly_once.core.declaration import is_template
from airflow_exactly_once.core.errors import ConfigurationError

# `s3a://` is Hadoop's name for the same bucket; both are read as S3.
SUPPORTED_SCHEMES = ("s3", "s3a")
LOCAL_SCHEME = "file"


@dataclass(frozen=True)
class ObjectLocation:
    """A bucket and a key prefix inside it (no leading or trailing slash; "" for the bucket's root)."""

    scheme: str
    bucket: str
    prefix: str

    def key(self, *parts: str) -> str:
        """The key of `parts` below the prefix, joined with slashes."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def folder(self, *parts: str) -> str:
        """A key prefix that ends with a slash: what lists exactly one folder's objects."""
        return f"{self.key(*parts)}/" if self.key(*parts) else ""

    def url(self, *parts: str) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key(*parts)}"


def scheme_of(path: str) -> str | None:
    """The scheme of `path` ("s3" of "s3://b/k"), None for a plain local path."""
    head, sep, _ = path.partition("://")
    return head.lower() if sep and head and "/" not in head else None


def is_object_storage(path: str) -> bool:
    """Whether `path` names object storage (any scheme but file://); an unsupported scheme counts, so that
    parse_object_location names what is supported instead of it being read as a local folder."""
    scheme = scheme_of(path)
    return scheme is not None and scheme != LOCAL_SCHEME


def parse_object_location(path: str, what: str) -> ObjectLocation:
    """`path` ("s3://bucket/prefix") as an ObjectLocation; `what` names the setting in errors."""
    scheme = scheme_of(path)
    if scheme not in SUPPORTED_SCHEMES:
        raise ConfigurationError(
            f"{what} {path!r}: the scheme {scheme or 'of a local path'}:// is not supported for object storage; "
            f"supported: {', '.join(s + '://' for s in SUPPORTED_SCHEMES)} (S3 and S3-compatible servers), or a "
            "local or mounted folder")
    bucket, _, prefix = path.split("://", 1)[1].partition("/")
    if not bucket:
        raise ConfigurationError(f"{what} {path!r} names no bucket; write {scheme}://<bucket>/<prefix>")
    if "*" in prefix or "?" in prefix or "//" in prefix:
        raise ConfigurationError(f"{what} {path!r}: the prefix may not hold wildcards or empty folder names")
    return ObjectLocation(scheme, bucket, prefix.strip("/"))


def storage_variant(value: Any, what: str) -> str | None:
    """The sink variant a location setting picks: "s3" for object storage (an unsupported scheme refused, naming the
    supported ones); None for a local path, or a template (looked at once the task renders it)."""
    if not isinstance(value, str) or is_template(value) or not is_object_storage(value):
        return None
    parse_object_location(value, what)
    return "s3"
