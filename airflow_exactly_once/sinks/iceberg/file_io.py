"""How both sides of the Iceberg sink reach a warehouse on object storage: one set of Iceberg `s3.*` properties.

Spark writes with Iceberg's S3FileIO (`io-impl`, from the `iceberg-aws-bundle` jar, which carries the AWS SDK
it needs) and pyiceberg commits with its PyArrowFileIO (pyarrow's S3); both read Iceberg's own property names
(`s3.endpoint`, `s3.access-key-id`, `s3.secret-access-key`, `s3.session-token`, `s3.path-style-access`,
`client.region`), so one mapping serves both. Not Hadoop's s3a: it needs hadoop-aws and an AWS SDK bundle
matched to Spark's Hadoop, and its `fs.s3a.*` settings, which pyiceberg does not read.

The credentials come from the spec's `aws_conn_id` (an Airflow `aws` connection, the Parquet sink's reader),
resolved when a task builds a client: the spec, the ledger, logs and XComs hold only the connection's id.
Without it, the `s3.*` properties the user gave the catalog, else the AWS SDKs' own default chain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.storage.errors import BucketNotFoundError, StorageCredentialsError
from airflow_exactly_once.storage.object_location import is_object_storage, parse_object_location
from airflow_exactly_once.sinks.iceberg.runtime import ICEBERG_RELEASE
from airflow_exactly_once.storage.s3_client import S3Access, connection_hint, explained, shared_client

S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
PYARROW_FILE_IO = "pyiceberg.io.pyarrow.PyArrowFileIO"
# The AWS SDK S3FileIO runs on (the Spark runtime has S3FileIO's classes, not the SDK), of the runtime's release.
AWS_BUNDLE_PACKAGE = f"org.apache.iceberg:iceberg-aws-bundle:{ICEBERG_RELEASE}"
ENDPOINT, PATH_STYLE, REGION = "s3.endpoint", "s3.path-style-access", "client.region"
CREDENTIAL_KEYS = ("s3.access-key-id", "s3.secret-access-key", "s3.session-token")
# S3-compatible servers take any region; the Java SDK refuses to start without one.
ENDPOINT_REGION = "us-east-1"
# How S3FileIO's AWS SDK names a missing bucket and refused credentials in the errors Spark passes on.
_SDK_BUCKET = ("NoSuchBucket", "The specified bucket does not exist")
_SDK_CREDENTIALS = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "Status Code: 403",
                    "Unable to load credentials")


def s3_properties(access: S3Access) -> dict[str, str]:
    """Iceberg's S3 properties of `access` (only what it sets: the SDKs' default chain fills in the rest)."""
    values = dict(zip(CREDENTIAL_KEYS, (access.access_key_id, access.secret_access_key, access.session_token)))
    if access.endpoint_url:
        values[ENDPOINT] = access.endpoint_url
        values[PATH_STYLE] = "false" if access.path_style is False else "true"
    values[REGION] = access.region_name or (ENDPOINT_REGION if access.endpoint_url else None)
    return {key: str(value) for key, value in values.items() if value}


def access_of(properties: Mapping[str, str]) -> S3Access:
    """The S3 access Iceberg's S3 properties describe (what the sink's own bucket check uses)."""
    key_id, secret, token = (properties.get(k) or None for k in CREDENTIAL_KEYS)
    path_style = properties.get(PATH_STYLE)
    return S3Access(endpoint_url=properties.get(ENDPOINT) or None, region_name=properties.get(REGION) or None,
                    access_key_id=key_id, secret_access_key=secret, session_token=token,
                    path_style=None if path_style is None else str(path_style).lower() == "true")


@dataclass(frozen=True)
class WarehouseStorage:
    """An Iceberg warehouse on object storage: the connection its credentials come from, and its bucket when the
    spec names it (a REST catalog may place tables itself: then the table's location names it)."""

    conn_id: str | None
    bucket: str | None

    @classmethod
    def of(cls, spec: Mapping[str, Any], warehouse: str, properties: Mapping[str, str]) -> "WarehouseStorage | None":
        """The spec's object storage: an `s3://` warehouse, or an `aws_conn_id` (a REST catalog's warehouse may be a
        name); None for a warehouse on a disk."""
        conn_id = spec.get("aws_conn_id") or None
        if conn_id is not None and not isinstance(conn_id, str):
            raise ConfigurationError(f"the iceberg sink's aws_conn_id must be the id of an Airflow 'aws' connection, "
                                     f"not {conn_id!r}")
        on_storage = bool(warehouse) and is_object_storage(warehouse)
        if not on_storage and conn_id is None:
            return None
        if conn_id is not None and any(properties.get(k) for k in CREDENTIAL_KEYS):
            raise ConfigurationError(f"the iceberg sink has an aws_conn_id ({conn_id!r}) and S3 credentials in its "
                                     f"catalog's 'properties' ({', '.join(k for k in CREDENTIAL_KEYS if properties.get(k))}); "
                                     "keep them in the connection only")
        location = parse_object_location(warehouse, "the iceberg sink's warehouse") if on_storage else None
        return cls(conn_id, location.bucket if location else None)

    def connection(self) -> S3Access | None:
        """The connection's S3 settings, read now (where a task runs); None without aws_conn_id."""
        if self.conn_id is None:
            return None
        # Airflow's connection reader: imported where a task reads the connection, not where this module is loaded
        from airflow_exactly_once.sinks.storage_connection import connection_access

        return connection_access(self.conn_id, "the iceberg sink")

    def client_properties(self, given: Mapping[str, str], client: str) -> dict[str, str]:
        """The catalog properties `client` ("spark" or "pyiceberg") gets: the connection's S3 properties under the
        spec's own (which win, and never hold credentials beside a connection), and that client's FileIO."""
        io_key, io_impl = {"spark": ("io-impl", S3_FILE_IO), "pyiceberg": ("py-io-impl", PYARROW_FILE_IO)}[client]
        connection = self.connection()
        return {**(s3_properties(connection) if connection else {}), io_key: io_impl, **given}

    def check(self, given: Mapping[str, str], bucket: str | None = None) -> None:
        """The bucket there and the credentials accepted, asked once with S3's HeadBucket: a clear error (not retried)
        before anything is written, instead of one from deep inside Spark. `bucket`: the table's, when the spec
        names none (a REST catalog's warehouse)."""
        bucket = bucket or self.bucket
        if bucket is None:
            return
        access = access_of(self.client_properties(given, "pyiceberg"))
        try:
            shared_client(access).head_bucket(Bucket=bucket)
        except Exception as exc:
            given_keys = self.conn_id is None and any(given.get(k) for k in CREDENTIAL_KEYS)
            hint = "the S3 credentials in the catalog's 'properties'" if given_keys else connection_hint(self.conn_id)
            raise explained(exc, access, bucket, f"the iceberg warehouse's bucket s3://{bucket}", hint,
                            setting="warehouse") from exc

    def explain_spark_error(self, text: str, table: str) -> ConfigurationError | None:
        """What an error of Spark's S3FileIO means when it is the storage's answer (a bucket gone, credentials
        refused since the plan), else None."""
        where = f"writing Iceberg table {table} to s3://{self.bucket or '<the table location>'}"
        if any(marker in text for marker in _SDK_BUCKET):
            return BucketNotFoundError(f"{where}: the bucket does not exist ({text[:300]}); create it, or change the "
                                       "sink's warehouse to a bucket that exists")
        if any(marker in text for marker in _SDK_CREDENTIALS):
                return StorageCredentialsError(f"{where}: the storage refused the credentials of "
                                           f"{connection_hint(self.conn_id)} ({text[:300]}); fix the connection's "
                                           "access key id (login) and secret access key (password), or grant them "
                                           "access to the bucket")
        return None
