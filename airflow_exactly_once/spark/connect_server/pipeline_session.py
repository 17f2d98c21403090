"""One Spark Connect session per pipeline, reused by its write attempts while the shipped code is the same.

A server-side session costs its writes more than its own setup: Spark starts Python workers per session
(their environment names the session's artifacts), so a write in a new session waits for a Python daemon
and workers to start and import the package, and the server keeps each session's daemon after the session
is released (docs/benchmarks.md, "Measurements behind choices"). A write therefore attaches to the session the pipeline's previous batch used
(`session_id` in the connection string), when that batch shipped the same bundle (the same digest of this
package and the transform's module: a worker that imported other code must not run this one), and
starts a new one otherwise, or when the server says the session was closed (released, or idle longer than
`spark.connect.session.manager.defaultSessionTimeout`).

A shared session is never released by a write; attempts are told apart by their operation tag (recorded
in the batch's details beside the session), which is what a newer attempt, `on_kill`, `abort` and
recovery interrupt (spark.connect_server.stop). A sink whose write changes the session's settings while
it runs (`SinkWriter.changes_session_conf`: Iceberg's `spark.wap.id`) gets a session of its own per
attempt, released after it, as before: two writes of a pipeline can run at once (interval backfills, a
fenced attempt still winding down) and must not change each other's settings.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from pathlib import Path
from typing import Any

from airflow_exactly_once.core.errors import raise_explained
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import BatchId
from airflow_exactly_once.core.sink_writer import SinkWriter
from airflow_exactly_once.spark.connect_server.session import (
    SESSION_DETAIL,
    TAG_DETAIL,
    close_session,
    explain,
    first_line,
    open_session,
    server_address,
    session_url,
)

log = logging.getLogger(__name__)

# The batch detail with the digest of the code the attempt shipped into its shared session.
BUNDLE_DETAIL = "connect_bundle"
_CLOSED = ("SESSION_CLOSED", "SESSION_NOT_FOUND")


def bundle_digest(path: str | Path) -> str:
    """What identifies the shipped code: the zip's bytes (it is built the same way from the same files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:32]


def attempt_tag(batch_id: BatchId) -> str:
    """The operation tag of one write attempt: unique, so stopping it stops nothing of another attempt."""
    return f"aeo-{batch_id.pipeline_id}-{batch_id.seq}-{uuid.uuid4().hex[:12]}"


def shares_session(wanted: bool, writer: SinkWriter) -> bool:
    """Whether a write attempt runs in its pipeline's shared session: unless the DAG asked for a session per
    attempt (`spark_connect_session='attempt'`) or the sink's staging changes session settings."""
    return wanted and not writer.changes_session_conf


def reusable_session(ledger: Ledger, batch_id: BatchId, digest: str) -> str | None:
    """The shared session of the pipeline's previous batch, if it ran the same code."""
    if batch_id.seq <= 1:
        return None
    previous = ledger.find_batch(BatchId(batch_id.pipeline_id, batch_id.seq - 1))
    if previous is None:
        return None
    details = previous.details
    if details.get(BUNDLE_DETAIL) != digest or not details.get(TAG_DETAIL):
        return None
    session_id = details.get(SESSION_DETAIL)
    return str(session_id) if session_id else None


def open_shared_session(url: str, session_id: str | None) -> Any:
    """A client of the shared session `session_id` (a new one when None or when the server closed it)."""
    if session_id is not None:
        spark = open_session(session_url(url, session_id))
        try:
            spark.version  # the first request: a session the server closed answers SESSION_CLOSED here
            return spark
        except Exception as exc:
            if not any(marker in str(exc) for marker in _CLOSED):
                close_session(spark, release=False)
                raise_explained(explain(exc, url), exc)
            log.info("the pipeline's session on the Spark Connect server at %s was closed (%s): starting a new one",
                     server_address(url), first_line(str(exc)))
            close_session(spark, release=False)
    return open_session(session_url(url, str(uuid.uuid4())))
