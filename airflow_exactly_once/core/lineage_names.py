"""Where data lives, named as OpenLineage names datasets (https://openlineage.io/docs/spec/naming), and the
URI of a pipeline's own Airflow Asset.

Each sink says where it writes (SinkCommitter.lineage_dataset) with these; the operators turn them into
OpenLineage datasets when the OpenLineage provider is installed (airflow_exactly_once/airflow_integration/lineage.py).
Names only, never credentials: user info in URLs is dropped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class DatasetName:
    namespace: str  # the data source, e.g. "kafka://broker:9092", "postgres://db:5432", "file", "s3://bucket"
    name: str  # the dataset in it, e.g. a topic, "database.schema.table", a path


def pipeline_asset_uri(pipeline_id: str) -> str:
    """The URI of the Airflow Asset whose events announce a pipeline's committed batches
    (airflow_integration/assets.py)."""
    return f"x-exactly-once://{pipeline_id}"


def kafka_dataset(bootstrap_servers: str, topic: str) -> DatasetName:
    """A topic: namespace `kafka://{first bootstrap server}`, as the spec names Kafka."""
    first = str(bootstrap_servers).split(",")[0].strip()
    return DatasetName(f"kafka://{first.split('://')[-1]}", topic)


def postgres_dataset(url: str, table: str) -> DatasetName:
    """A table: `postgres://{host}:{port}` and `{database}.{schema}.{table}` (schema `public` if not given)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "localhost", parts.port or 5432
    schema, _, name = table.rpartition(".")
    return DatasetName(f"postgres://{host}:{port}", f"{parts.path.lstrip('/')}.{schema or 'public'}.{name}")


_BUCKET_SCHEMES = {"s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gs"}


def file_dataset(location: str) -> DatasetName:
    """Files at a local path or a URI: `file` + the path, `s3://{bucket}` / `gs://{bucket}` + the key,
    `hdfs://{host}:{port}` (and other schemes: their authority) + the path."""
    if "://" not in location:
        return DatasetName("file", os.path.abspath(location))
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    authority = parts.hostname or ""
    if parts.port:
        authority += f":{parts.port}"
    if scheme == "file":
        return DatasetName("file", parts.path)
    if scheme in ("abfss", "wasbs"):  # the user part is the container, not a credential
        return DatasetName(f"{scheme}://{parts.netloc}", parts.path.lstrip("/"))
    if scheme in _BUCKET_SCHEMES:
        return DatasetName(f"{_BUCKET_SCHEMES[scheme]}://{authority}", parts.path.lstrip("/"))
    return DatasetName(f"{scheme}://{authority}", parts.path)
