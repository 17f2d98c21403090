"""The "s3" variant of a sink whose location setting may name object storage, picked from that setting and
checked when the DAG is parsed: shared by the declarations of the sinks that write files there (Parquet, Delta)."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from airflow_exactly_once.storage.object_location import storage_variant


class ObjectStorageVariant:
    """Mixed into a SinkSpec before it: `variant` is "s3" when `location_key` names object storage."""

    location_key: ClassVar[str] = "path"

    @classmethod
    def variant(cls, spec: Mapping[str, Any]) -> str | None:
        """"s3" for an object-storage location (an unsupported scheme is refused, naming the supported ones)."""
        return storage_variant(spec.get(cls.location_key), f"{cls.owner()}'s {cls.location_key}")  # type: ignore

    @classmethod
    def check_values(cls, spec: Mapping[str, Any], *, rendered: bool = True) -> None:
        """Also the location's scheme, when the DAG is parsed."""
        super().check_values(spec, rendered=rendered)  # type: ignore[misc]
        cls.variant(spec)
