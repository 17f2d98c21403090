"""A Delta table on object storage (s3://bucket/prefix/table): its folder through an S3 client, and delta-rs's
storage options from the same `aws` connection.

Whether the store makes delta-rs's commits safe (it honours a conditional PUT) is asked once, at plan time, by
sinks.delta.conditional_put; `single_writer` is the spec's declaration that waives that check.
"""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.storage.object_location import ObjectLocation
from airflow_exactly_once.sinks.storage_bucket import SinkBucket
from airflow_exactly_once.storage import multipart
from airflow_exactly_once.storage.s3_client import S3Access, error_code


def delta_storage_options(access: S3Access, single_writer: bool) -> dict[str, str]:
    """delta-rs's S3 settings (object_store's names) for `access`: the keys only when the connection gives them
    (otherwise delta-rs's own credential chain answers), path-style addressing and plain HTTP for a custom
    endpoint, as the boto3 client of storage.s3_client does."""
    options: dict[str, str] = {}
    if access.endpoint_url:
        options["AWS_ENDPOINT_URL"] = access.endpoint_url
        options["AWS_ALLOW_HTTP"] = "true" if access.endpoint_url.startswith("http://") else "false"
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "true" if access.path_style is False else "false"
    region = access.region_name or ("us-east-1" if access.endpoint_url else None)
    for key, value in (("AWS_REGION", region), ("AWS_ACCESS_KEY_ID", access.access_key_id),
                       ("AWS_SECRET_ACCESS_KEY", access.secret_access_key),
                       ("AWS_SESSION_TOKEN", access.session_token)):
        if value:
            options[key] = value
    if single_writer:
        options["AWS_S3_ALLOW_UNSAFE_RENAME"] = "true"
    return options


class ObjectFolder:
    """A table below `location` in the bucket `bucket` names."""

    def __init__(self, location: ObjectLocation, bucket: SinkBucket, single_writer: bool) -> None:
        self.location, self.bucket, self.single_writer = location, bucket, single_writer
        self.where = self.uri = f"s3://{location.bucket}/{location.prefix}".rstrip("/")

    def _key(self, relative: str) -> str:
        return self.location.key(relative)

    def _prefix(self, folder: str) -> str:
        return self.location.folder(folder)

    def _relative(self, key: str) -> str:
        return key[len(self.location.folder()):]

    def storage_options(self) -> dict[str, str]:
        return delta_storage_options(self.bucket.access, self.single_writer)

    def has_log(self) -> bool:
        prefix = self._prefix("_delta_log")
        found = self.bucket.call(f"listing {self.where}/_delta_log", lambda c: c.list_objects_v2(
            Bucket=self.bucket.name, Prefix=prefix, MaxKeys=50))
        return any(o["Key"].endswith(".json") for o in found.get("Contents", []))

    def _listed(self, folder: str) -> tuple[list[str], list[str]]:
        """(folder names, file names) directly in `folder`."""
        prefix = self._prefix(folder) if folder else self.location.folder()
        folders: list[str] = []
        names: list[str] = []

        def listing(client: Any) -> None:
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket.name, Prefix=prefix,
                                                                         Delimiter="/"):
                folders.extend(p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", []))
                names.extend(o["Key"][len(prefix):] for o in page.get("Contents", []))

        self.bucket.call(f"listing {self.where}/{folder}", listing)
        return sorted(folders), sorted(n for n in names if n)  # "" is a console's folder marker

    def names(self) -> list[str]:
        folders, files = self._listed("")
        return sorted(folders + files)

    def make(self) -> None:
        """Nothing to make: a prefix exists once a key is under it. The bucket is checked instead."""
        self.bucket.call(f"opening bucket {self.bucket.name!r}", lambda c: c.head_bucket(Bucket=self.bucket.name))

    def files(self, folder: str) -> list[str]:
        prefix = self._prefix(folder)
        keys = self.bucket.call(f"listing {self.where}/{folder}",
                                lambda c: multipart.listed_keys(c, self.bucket.name, prefix))
        return sorted(self._relative(k) for k in keys if not k.endswith("/"))

    def subfolders(self, folder: str) -> list[str]:
        return self._listed(folder)[0]

    def delete_tree(self, folder: str) -> None:
        """Every key under the folder's prefix, and any upload a killed writer left open there."""
        prefix = self._prefix(folder)
        name = self.bucket.name

        def delete(client: Any) -> None:
            for key, upload_id in multipart.open_uploads(client, name, prefix):
                multipart.abort_upload(client, name, key, upload_id)
            multipart.delete_keys(client, name, multipart.listed_keys(client, name, prefix))

        self.bucket.call(f"deleting {self.where}/{folder}", delete)

    def delete(self, path: str) -> None:
        key = self._key(path)
        self.bucket.call(f"deleting {self.where}/{path}", lambda c: c.delete_object(Bucket=self.bucket.name, Key=key))

    def read_text(self, path: str) -> str | None:
        key = self._key(path)

        def read(client: Any) -> str | None:
            try:
                return client.get_object(Bucket=self.bucket.name, Key=key)["Body"].read().decode()
            except Exception as exc:
                if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                    return None
                raise

        return self.bucket.call(f"reading {self.where}/{path}", read)

    def write_text(self, path: str, text: str) -> None:
        key = self._key(path)  # one PUT: an object appears whole
        self.bucket.call(f"writing {self.where}/{path}", lambda c: c.put_object(
            Bucket=self.bucket.name, Key=key, Body=text.encode(), ContentType="application/json"))
