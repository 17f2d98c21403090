"""The write step on a Spark Connect server: a warm Spark, no driver to start per batch.

The write task connects (`sc://host:port`), to its pipeline's shared session when it can
(spark.connect_server.pipeline_session: the session's Python workers are warm), ships this
package and the transform's module as session artifacts (the server's Python workers run the
sinks' partition writers), tags its operations with a tag of the attempt's own, and runs the
same `run_write` as the in-process path. What keeps it exactly once
is unchanged (the ledger fences stale attempts, the sink commits from the stored committable);
what Spark Connect adds is that the job runs on a server that outlives the task, so:

* a newer attempt claiming the batch interrupts the older attempt's operations: through a
  fence watch while the older client lives, and through the older attempt's server-side
  session and tag (recorded in the batch's details) when the older client died, waiting
  until the server reports them ended (spark.connect_server.stop); `abort` and the recovery in
  `plan` do the same before they clean up the sink;
* a killed task's operations are interrupted by `on_kill` (`cancel`), or by the server once the client
  is gone for longer than `spark.connect.execute.manager.detachedTimeout`;
* an unreachable server, or one that cannot load Spark's Kafka connector or the sinks'
  Python libraries, is an error that says which.
"""

from __future__ import annotations

import logging
import tempfile
from typing import Any, Callable

from airflow_exactly_once.core.errors import raise_explained
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.task_log import TaskLog
from airflow_exactly_once.sinks import pipeline_writer
from airflow_exactly_once.spark.connect_server.pipeline_session import (
    BUNDLE_DETAIL,
    attempt_tag,
    bundle_digest,
    open_shared_session,
    reusable_session,
    shares_session,
)
from airflow_exactly_once.spark.connect_server.session import (
    SESSION_DETAIL,
    TAG_DETAIL,
    SparkConnectUnavailable,
    close_session,
    explain,
    open_session,
    server_address,
)
from airflow_exactly_once.spark.connect_server.stop import stop_session_operations
from airflow_exactly_once.spark.fence_watch import FenceWatch
from airflow_exactly_once.spark.launch.launcher import Stopwatch, WriteLauncher
from airflow_exactly_once.spark.shipping import build_bundle
from airflow_exactly_once.spark.write_job import run_write
from airflow_exactly_once.spark.write_report import WriteReport

log = logging.getLogger(__name__)

__all__ = ["SESSION_DETAIL", "ConnectWrite", "SparkConnectUnavailable"]


class ConnectWrite(WriteLauncher):
    """One write attempt on a Spark Connect server: `start` opens the session, `wait` ships the code and runs the
    job there; `cancel` (on_kill, or a newer attempt's fence) interrupts this attempt's operations."""

    def __init__(self, coordinator: BatchCoordinator, url: str, transform: str | Callable | None,
                 log_: TaskLog | None = None, share_session: bool = True) -> None:
        self.coordinator = coordinator
        self.url = url
        self.transform = transform
        self.log = log_ or log
        self.spark: Any = None
        self.tag: str | None = None
        self.share_session = share_session  # the DAG's spark_connect_session: 'pipeline' (True) or 'attempt'
        self.shared = False  # in the pipeline's shared session (not released), or in one of its own

    def start(self, batch_id: BatchId) -> None:
        self.batch_id = batch_id
        self.clock = Stopwatch()
        self.folder = tempfile.TemporaryDirectory(prefix="exactly-once-connect-")
        try:
            name = self.transform if isinstance(self.transform, str) else None
            self.bundle = build_bundle(self.folder.name, name).py_files
            self.digest = bundle_digest(self.bundle)
            config = self.coordinator.config
            self.writer = pipeline_writer(config).bind(config, self.coordinator.sink)
            self.shared = shares_session(self.share_session, self.writer)
            if self.shared:
                self.spark = open_shared_session(
                    self.url, reusable_session(self.coordinator.ledger, batch_id, self.digest))
            else:
                self.spark = open_session(self.url)
        except BaseException:
            self.folder.cleanup()
            raise
        self.clock.session_ready()
        self.tag = attempt_tag(batch_id)

    def wait(self) -> WriteReport:
        watch = FenceWatch(self.coordinator.ledger, self.batch_id, on_fenced=lambda _reason: self.cancel())
        ended = False
        try:
            self.spark.addTag(self.tag)
            self.spark.addArtifacts(str(self.bundle), pyfile=True)
            report = run_write(self.spark, self.coordinator, self.batch_id, transform=self.transform,
                               on_claimed=lambda claimed: self._claimed(claimed, watch), writer=self.writer)
            report["seconds"] = self.clock.seconds()
            ended = True
            return report
        except Exception as exc:
            raise_explained(watch.explain(explain(exc, self.url)), exc)
        finally:
            watch.stop()
            if self.shared and not ended:  # a failure or a timeout: what still runs is this attempt's only
                self.cancel()  # (releasing a session of its own interrupts everything in it)
            close_session(self.spark, release=not self.shared)
            self.folder.cleanup()

    def _claimed(self, batch: Batch, watch: FenceWatch) -> None:
        """This attempt holds the batch now: stop what an earlier attempt still runs, record this attempt's session
        and tag."""
        details = self.coordinator.ledger.get_batch(batch.id).details
        previous, previous_tag = details.get(SESSION_DETAIL), details.get(TAG_DETAIL)
        if previous and (previous != self.spark.session_id or previous_tag):
            self._interrupt(previous, previous_tag, batch.id)
        recorded = {SESSION_DETAIL: self.spark.session_id, TAG_DETAIL: self.tag if self.shared else None,
                    BUNDLE_DETAIL: self.digest if self.shared else None}
        self.coordinator.ledger.update_details(batch.id, **recorded)
        watch.start(batch)

    def _interrupt(self, session_id: str, tag: str | None, batch_id: BatchId) -> None:
        """Stop what an earlier attempt of this batch runs on the server (its task may be dead), and wait until it
        ended: its writers must not stage anything beside this attempt's."""
        running = stop_session_operations(self.url, session_id, tag)
        if running:
            self.log.warning("interrupted %d operation(s) an earlier attempt of batch %s left running on %s",
                             running, batch_id, server_address(self.url))

    def cancel(self) -> None:
        """Interrupt this attempt's operations on the server (on_kill, or fenced by a newer attempt)."""
        if self.spark is not None and self.tag is not None:
            try:
                interrupted = self.spark.interruptTag(self.tag)
            except Exception as exc:
                self.log.warning("could not interrupt the Spark Connect operations of this attempt: %s", exc)
                return
            if interrupted:
                self.log.warning("interrupted %d Spark Connect operation(s) of this write attempt on %s",
                                 len(interrupted), server_address(self.url))
