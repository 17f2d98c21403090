"""The GIDs of the PostgreSQL sink's prepared transactions: ``aeo.<pipeline>.b<batch>.p<partition>.a<attempt>``.

A GID names one writer attempt's prepared transaction on the server, so anyone holding the pipeline id
can find a batch's transactions again (by the prefix :func:`gid_prefix` gives) after any crash. Its own
module because the writers, the commit and the cleanup all name transactions the same way, and doing
so needs no connection (nor psycopg2).
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["make_gid", "gid_prefix"]

GID_NAMESPACE = "aeo"
MAX_GID_BYTES = 199  # PostgreSQL's limit is GIDSIZE (200) including the terminating NUL.
_SAFE = re.compile(r"[A-Za-z0-9_-]+")
_UNSAFE_CHAR = re.compile(r"[^A-Za-z0-9_-]")


def _pipeline_slug(pipeline_id: str) -> str:
    """``pipeline_id`` as GID-safe text, one-to-one (up to a 48-bit hash).

    Ids of letters, digits, ``_`` and ``-`` (up to 64 characters) are used as they are.
    Others are cleaned and get ``~`` plus a hash of the original: ``~`` never occurs in
    a clean id, so a cleaned id cannot collide with a clean one.
    """
    if not isinstance(pipeline_id, str) or not pipeline_id:
        raise ValueError(f"pipeline_id must be a non-empty string, not {pipeline_id!r}")
    if _SAFE.fullmatch(pipeline_id) and len(pipeline_id) <= 64:
        return pipeline_id
    digest = hashlib.sha256(pipeline_id.encode()).hexdigest()[:12]
    return f"{_UNSAFE_CHAR.sub('_', pipeline_id)[:48]}~{digest}"


def _non_negative(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, not {value!r}")
    return value


def gid_prefix(pipeline_id: str, batch_seq: int | None = None) -> str:
    """The prefix shared by all GIDs of a pipeline (or of one of its batches).

    It ends with ``.``, so the prefix of batch 1 does not match batch 10, nor pipeline
    ``a`` pipeline ``ab``.
    """
    prefix = f"{GID_NAMESPACE}.{_pipeline_slug(pipeline_id)}."
    if batch_seq is not None:
        prefix += f"b{_non_negative('batch_seq', batch_seq)}."
    return prefix


def make_gid(pipeline_id: str, batch_seq: int, partition_id: int, attempt: int) -> str:
    """The GID of one writer attempt: ``aeo.<pipeline>.b<batch>.p<partition>.a<attempt>``.

    Only ``[A-Za-z0-9_.~-]``, at most 199 bytes (PostgreSQL allows 199).
    """
    gid = (f"{gid_prefix(pipeline_id, batch_seq)}p{_non_negative('partition_id', partition_id)}"
           f".a{_non_negative('attempt', attempt)}")
    check_gid(gid)
    return gid


def check_gid(gid: str) -> None:
    if not isinstance(gid, str) or not gid:
        raise ValueError(f"gid must be a non-empty string, not {gid!r}")
    if len(gid.encode()) > MAX_GID_BYTES:
        raise ValueError(f"gid is {len(gid.encode())} bytes; PostgreSQL allows at most {MAX_GID_BYTES}: {gid!r}")
