"""The staged folders of a pipeline's withdrawn batches: marked when a commit removes their files, deleted once
the table's deletedFileRetentionDuration has passed (sinks.delta.commits decides which).

VACUUM leaves the sink's `_aeo_staging` folder alone, so without this the files of every retracted or replaced
batch would stay for good. A marker (`_aeo_staging/<pipeline>/_withdrawn/<attempt>.json`) holds when the removing
commit was made, taken right after it: never earlier than the commit, so a folder never goes before the retention
has passed. A crash between the commit and the marker is made good by the retried retraction or replacement, which
finds the batch withdrawn already and marks its folder then (later still: on the safe side).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Iterable
from urllib.parse import unquote

import pyarrow as pa

from airflow_exactly_once.sinks.delta import commits
from airflow_exactly_once.sinks.delta.target import DeltaTarget

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


class WithdrawnFolders:
    """Markers and deletion of one pipeline's withdrawn attempt folders in one Delta table."""

    def __init__(self, target: DeltaTarget, pipeline_id: str) -> None:
        self.target = target
        self.pipeline_id = pipeline_id

    def mark(self, folders: Iterable[str], at_ms: int | None = None) -> None:
        """Record that a commit removed every file of `folders` (relative to the table) at or before `at_ms`; a
        folder marked before keeps its earlier time."""
        at = now_ms() if at_ms is None else at_ms
        store = self.target.folder
        for folder in sorted(set(folders)):
            marker = commits.withdrawn_marker(self.pipeline_id, folder)
            if store.read_text(marker) is not None or not store.files(folder):
                continue
            store.write_text(marker, json.dumps({"folder": folder, "withdrawn_at_ms": at}))

    def marked(self) -> dict[str, int]:
        """Every marked folder of the pipeline, with when it was withdrawn."""
        store = self.target.folder
        found: dict[str, int] = {}
        for marker in store.files(f"{commits.STAGING}/{self.pipeline_id}/{commits.WITHDRAWN}"):
            if not marker.endswith(".json") or marker.rsplit("/", 1)[-1].startswith("."):
                continue
            try:
                data = json.loads(store.read_text(marker) or "")
                found[str(data["folder"])] = int(data["withdrawn_at_ms"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring the unreadable marker %s (%s); its folder stays", marker, exc)
        return found

    def live_folders(self, table: Any) -> set[str]:
        """The pipeline's attempt folders holding a file the table reads now."""
        prefix = f"{commits.STAGING}/{self.pipeline_id}/"
        paths = (unquote(p) for p in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())
        return {"/".join(p.split("/")[:3]) for p in paths if p.startswith(prefix)}

    def sweep(self, at_ms: int | None = None) -> list[str]:
        """Delete the marked folders whose withdrawal is older than the table's retention; the deleted folders. Reads
        the table only when a marker exists (most commits find none: one folder listing)."""
        marked = self.marked()
        if not marked:
            return []
        table = self.target.load()
        retention = commits.deleted_file_retention_ms(table.metadata().configuration or {})
        if retention is None:
            log.warning("%s of %s is not an interval Delta understands; the files of withdrawn batches stay in %s",
                        commits.RETENTION_PROPERTY, self.target.root, commits.STAGING)
        expired = commits.expired_withdrawals(marked, self.live_folders(table), now_ms() if at_ms is None else at_ms,
                                              retention)
        for folder in expired:
            self.target.folder.delete_tree(folder)
            self.target.folder.delete(commits.withdrawn_marker(self.pipeline_id, folder))
        return expired
