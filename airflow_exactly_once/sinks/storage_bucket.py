"""A sink's bucket as a client sees it: the S3 client made from the spec's `aws_conn_id` (resolved where a task
runs; the spec holds only the connection's id), and every call's error said in terms of what to change. Shared by
the sinks that keep files on object storage (the Parquet sink's s3 layout, the Delta sink's tables)."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from airflow_exactly_once.storage.object_location import ObjectLocation
from airflow_exactly_once.sinks.storage_connection import connection_access
from airflow_exactly_once.storage.s3_client import S3Access, connection_hint, explained, shared_client

T = TypeVar("T")


class SinkBucket:
    """One spec's bucket: `call(doing, fn)` runs `fn(client)` and explains what goes wrong."""

    def __init__(self, spec: dict[str, Any], location: ObjectLocation, user: str) -> None:
        self.spec, self.location, self.user = spec, location, user  # user: the sink, as errors name it
        self._access: S3Access | None = None
        self._client: Any = None

    @property
    def name(self) -> str:
        return self.location.bucket

    @property
    def conn_hint(self) -> str:
        return connection_hint(self.spec.get("aws_conn_id"))

    @property
    def access(self) -> S3Access:
        if self._access is None:
            self._access = connection_access(self.spec.get("aws_conn_id"), self.user)
        return self._access

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = shared_client(self.access)
        return self._client

    def call(self, doing: str, fn: Callable[[Any], T]) -> T:
        try:
            return fn(self.client)
        except Exception as exc:
            raise explained(exc, self.access, self.name, doing, self.conn_hint) from exc
