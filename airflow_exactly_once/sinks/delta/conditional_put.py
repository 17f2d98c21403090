"""Whether the object store under a Delta table keeps delta-rs's commits apart: its answer to a conditional PUT,
asked once at plan time.

delta-rs (1.x) commits version n by writing `_delta_log/<n>.json` with a conditional PUT (`If-None-Match: *`):
of two writers racing for version n, the store refuses the second, which then reads the table again. That is
safe exactly on a store that honours the header (AWS S3 since 2024, MinIO, Cloudflare R2); a store that ignores
it lets the second writer overwrite the first one's commit, silently. delta-rs 1.x has no other mechanism (its
DynamoDB lock, `AWS_S3_LOCKING_PROVIDER`, is gone; `AWS_S3_ALLOW_UNSAFE_RENAME` only waives the safety). So the
sink asks the store once, at plan time (`check_conditional_put`): a store that does not honour a conditional PUT is
refused unless the spec says `single_writer: True`, the user's knowing declaration that only one commit at a
time ever reaches the table.
"""

from __future__ import annotations

import uuid
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.sinks.delta.commits import STAGING
from airflow_exactly_once.sinks.delta.object_folder import ObjectFolder
from airflow_exactly_once.storage.s3_client import error_code

# What a store answers to a conditional PUT whose condition fails: it honours the header.
REFUSED_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"})
PROBE_FOLDER = f"{STAGING}/_conditional_put_probe"


def honours_conditional_put(answer_code: str | None) -> bool:
    """Whether a store honours `If-None-Match: *`, from its answer to a conditional PUT over an existing object
    (None: it accepted the PUT, overwriting the object)."""
    return answer_code in REFUSED_CODES


def check_conditional_put(folder: ObjectFolder) -> None:
    """ConfigurationError when the store does not honour a conditional PUT and the spec did not declare a single
    writer: delta-rs's commits could then overwrite each other."""
    if folder.single_writer:
        return
    key = folder.location.key(f"{PROBE_FOLDER}/{uuid.uuid4().hex}")
    name = folder.bucket.name

    def probe(client: Any) -> str | None:
        client.put_object(Bucket=name, Key=key, Body=b"1")
        try:
            client.put_object(Bucket=name, Key=key, Body=b"2", IfNoneMatch="*")
            return None
        except Exception as exc:
            code = error_code(exc)
            if code is None:
                raise
            return code
        finally:
            client.delete_object(Bucket=name, Key=key)

    answer = folder.bucket.call(f"probing conditional writes in bucket {name!r}", probe)
    if not honours_conditional_put(answer):
        raise ConfigurationError(
            f"the object store of {folder.where} ({folder.bucket.access.where}) does not honour conditional writes "
            f"(a PUT with If-None-Match: * over an existing object was {'accepted' if answer is None else answer}"
            "), which delta-rs's commits rely on: two commits racing for one table version would overwrite each "
            "other. Use a store that honours them (AWS S3, MinIO, Cloudflare R2), or, if only one commit at a "
            "time ever reaches this table (this pipeline without parallel interval batches, and no other writer), "
            "declare it with 'single_writer': True")
