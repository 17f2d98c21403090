"""An S3 client from plain settings, and S3's errors as errors that say what to change.

`S3Access` is what a connection resolves to (airflow_integration.connections.aws_connection_settings):
picklable, so a partition writer carries it to the executors; its repr shows no key. Without keys, boto3's
own credential chain answers (environment, instance role, web identity).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping

from airflow_exactly_once.core.errors import ExactlyOnceError, MissingExtraError, SinkError
from airflow_exactly_once.storage.errors import BucketNotFoundError, StorageCredentialsError, StorageUnreachableError

# Codes an S3 server answers for credentials it does not accept (AWS, and S3-compatible servers).
CREDENTIAL_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403",
                              "InvalidToken", "ExpiredToken", "InvalidClientTokenId", "AuthorizationHeaderMalformed"})
BUCKET_CODES = frozenset({"NoSuchBucket", "404"})
CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 120


@dataclass(frozen=True)
class S3Access:
    """How to reach an S3 endpoint. The keys stay out of repr (a task log that prints a writer shows none)."""

    endpoint_url: str | None = None
    region_name: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    # Path-style (http://host/bucket/key) for a custom endpoint: S3-compatible servers rarely serve per-bucket
    # host names; AWS itself gets virtual-hosted addressing.
    path_style: bool | None = None

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> "S3Access":
        """From the keyword settings a connection resolves to (boto3's names)."""
        return cls(endpoint_url=settings.get("endpoint_url") or None, region_name=settings.get("region_name") or None,
                   access_key_id=settings.get("aws_access_key_id") or None,
                   secret_access_key=settings.get("aws_secret_access_key") or None,
                   session_token=settings.get("aws_session_token") or None)

    @property
    def where(self) -> str:
        """The endpoint as errors name it."""
        return self.endpoint_url or f"AWS S3 ({self.region_name or 'the default region'})"

    def client(self) -> Any:
        """A boto3 S3 client. Checksums only where S3 requires them: S3-compatible servers (s3proxy, MinIO
        releases, Ceph) refuse the trailing checksums newer boto3 sends by default."""
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise MissingExtraError("object storage (an s3:// path)", "s3", exc.name) from exc

        path_style = self.endpoint_url is not None if self.path_style is None else self.path_style
        config = Config(s3={"addressing_style": "path" if path_style else "auto"},
                        request_checksum_calculation="when_required", response_checksum_validation="when_required",
                        connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                        retries={"mode": "standard", "max_attempts": 3})
        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint_url, region_name=self.region_name, aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key, aws_session_token=self.session_token, config=config)


@lru_cache(maxsize=16)
def shared_client(access: S3Access) -> Any:
    """One client per access and process (boto3 clients are thread-safe): a Spark Python worker is reused across
    tasks and batches, and making a client costs about 0.2 s of CPU."""
    return access.client()


def connection_hint(conn_id: str | None) -> str:
    """Where a sink's credentials came from (its `aws_conn_id`, or none), as errors name it."""
    return f"the aws connection {conn_id!r}" if conn_id else "this worker's own AWS credentials (no aws_conn_id)"


def error_code(exc: BaseException) -> str | None:
    """The S3 error code of a botocore ClientError ("NoSuchUpload"), None for any other error."""
    response = getattr(exc, "response", None)
    if not isinstance(response, Mapping):
        return None
    return str((response.get("Error") or {}).get("Code") or
               (response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or "") or None


def explained(exc: BaseException, access: S3Access, bucket: str, doing: str, conn_hint: str,
              setting: str = "path") -> ExactlyOnceError:
    """`exc`, raised while `doing` (e.g. "writing s3://b/k"), as an error that names what to change.

    `conn_hint` says where the credentials came from ("the aws connection 'lake'"); `setting` is the sink's key that
    names the bucket ("path", "warehouse").
    """
    from botocore.exceptions import (ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError,
                                     NoCredentialsError, ReadTimeoutError)

    if isinstance(exc, ExactlyOnceError):
        return exc
    if isinstance(exc, (EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError)):
        return StorageUnreachableError(
            f"{doing}: the S3 endpoint {access.where} did not answer ({type(exc).__name__}); check the endpoint_url "
            f"of {conn_hint} and that the server runs; retried by the task")
    if isinstance(exc, NoCredentialsError):
        return StorageCredentialsError(
            f"{doing}: no AWS credentials were found; give the sink an aws_conn_id (an Airflow connection of type "
            "'aws': login = access key id, password = secret access key), or give this worker credentials of its "
            "own (environment, instance role)")
    code = error_code(exc)
    if code in BUCKET_CODES:
        return BucketNotFoundError(
            f"{doing}: the bucket {bucket!r} does not exist at {access.where}; create it, or change the sink's "
            f"{setting} to a bucket that exists")
    if code in CREDENTIAL_CODES:
        return StorageCredentialsError(
            f"{doing}: {access.where} refused the credentials of {conn_hint} ({code}); fix the access key id (login) "
            f"and secret access key (password) of that connection, or grant them access to bucket {bucket!r}")
    return SinkError(f"{doing}: {type(exc).__name__} {code or ''}: {exc}", retriable=True)
