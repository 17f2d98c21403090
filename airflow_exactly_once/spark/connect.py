"""The write step on a Spark Connect server: a warm Spark, no driver to start per batch.

The write task connects (`sc://host:port`), ships this package and the transform's module as
session artifacts (the server's Python workers run the sinks' partition writers), tags its
operations, and runs the same `run_write` as the in-process path. What keeps it exactly once
is unchanged (the ledger fences stale attempts, the sink commits from the stored committable);
what Spark Connect adds is that the job runs on a server that outlives the task, so:

* a newer attempt claiming the batch interrupts the older attempt's operations: through a
  fence watch while the older client lives, and through the older attempt's server-side
  session (its id is recorded in the batch's details) when the older client died;
* a killed task's operations are interrupted by `on_kill`, or by the server once the client
  is gone for longer than `spark.connect.execute.manager.detachedTimeout`;
* an unreachable server, or one that cannot load Spark's Kafka connector or the sinks'
  Python libraries, is an error that says which.
"""

from __future__ import annotations

import logging
import socket
import tempfile
import time
from typing import Any, Callable

from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.spark.fence_watch import FenceWatch
from airflow_exactly_once.spark.connector import kafka_package
from airflow_exactly_once.spark.job import lacks_kafka_connector, run_write
from airflow_exactly_once.spark.shipping import build_bundle

log = logging.getLogger(__name__)

SESSION_DETAIL = "connect_session"
# A lost server is found out within about half a minute (pyspark's default retries last minutes).
RETRIES, MAX_BACKOFF_MS = 5, 8_000


class SparkConnectUnavailable(ExactlyOnceError):
    """The Spark Connect server cannot be reached now; a retry can succeed."""

    retriable = True


def session_url(url: str, session_id: str | None = None) -> str:
    """`url` with a `session_id` parameter (Spark Connect's connection string: sc://host:port/;k=v;...)."""
    if session_id is None:
        return url
    separator = "" if "/;" in url else ("/" if not url.endswith("/") else "")
    return f"{url}{separator};session_id={session_id}"


def explain(exc: BaseException, url: str) -> BaseException:
    """What went wrong with the server, in terms of what to change; other errors pass unchanged.

    A server error can surface anywhere, also while the transform builds its plan (which our
    own wrapping would call a transform bug), so the whole chain of causes is read.
    """
    chain, cause = [], exc
    while cause is not None and len(chain) < 10:
        chain.append(cause)
        cause = cause.__cause__
    text = " ".join(str(e) for e in chain)
    if "UNAVAILABLE" in text or "failed to connect to all addresses" in text or "Connection refused" in text:
        return SparkConnectUnavailable(f"the Spark Connect server at {url} cannot be reached ({_first_line(text)}): "
                                       "check that it runs and that spark_conn_id / spark.remote points at it")
    if "SESSION_CLOSED" in text or "SESSION_NOT_FOUND" in text:
        return SparkConnectUnavailable(f"the write's session on the Spark Connect server at {url} ended (a newer "
                                       f"attempt of the batch closed it, or the server restarted): {_first_line(text)}")
    if lacks_kafka_connector(text):
        return ConfigurationError(f"the Spark Connect server at {url} cannot load Spark's Kafka connector: start it "
                                  f"with --packages {kafka_package()} (the server's Spark release), or --jars")
    missing = _missing_module(text)
    if missing is not None:
        return ConfigurationError(f"the Python workers of the Spark Connect server at {url} cannot import {missing!r}: "
                                  "install it in the server's Python (the sinks' writers run there: kafka-python, "
                                  "confluent-kafka, psycopg2, pyarrow)")
    return exc


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:300] if text.strip() else ""


def _missing_module(text: str) -> str | None:
    marker = "No module named '"
    if marker not in text:
        return None
    return text.split(marker, 1)[1].split("'", 1)[0]


def _reachable(url: str, timeout_s: float) -> bool:
    address = url[len("sc://"):].split("/", 1)[0]
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host or address, int(port or 15002)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def open_session(url: str, connect_timeout_s: float = 10.0) -> Any:
    """A Spark Connect session whose calls give up after seconds, not Spark's default ten minutes of retries."""
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy

    if not _reachable(url, connect_timeout_s):
        raise SparkConnectUnavailable(f"the Spark Connect server at {url} does not accept connections: check that it "
                                      "runs and that spark_conn_id / spark.remote points at it")
    try:
        spark = SparkSession.builder.remote(url).create()
    except Exception as exc:
        raise explain(exc, url) from exc
    spark.client.set_retry_policies([DefaultPolicy(max_retries=RETRIES, max_backoff=MAX_BACKOFF_MS)])
    return spark


def close_session(spark: Any) -> None:
    """Release the session on the server; a server that is gone already is no error."""
    try:
        spark.stop()
    except Exception as exc:
        log.info("could not release the Spark Connect session %s: %s", spark.session_id, _first_line(str(exc)))


def release_only(spark: Any) -> None:
    """Release a session on the server and close its channel, but not as `stop()` does: that also shuts
    down pyspark's process-wide thread pool under the operations of the process's other sessions (they
    then fail with "cannot schedule new futures after shutdown")."""
    try:
        spark.client.release_session()
    except Exception as exc:
        log.info("could not release the Spark Connect session %s: %s", spark.session_id, _first_line(str(exc)))
    channel = getattr(spark.client, "_channel", None)  # pyspark keeps it private; gRPC would close it when collected
    if channel is not None:
        channel.close()


class ConnectWrite:
    """One write attempt on a Spark Connect server, owned by the write task (which calls `kill` from on_kill)."""

    def __init__(self, coordinator: BatchCoordinator, url: str, transform: str | Callable | None,
                 log_: logging.Logger | None = None) -> None:
        self.coordinator = coordinator
        self.url = url
        self.transform = transform
        self.log = log_ or log
        self.spark: Any = None
        self.tag: str | None = None

    def run(self, batch_id: BatchId) -> dict[str, Any]:
        started = time.monotonic()
        self.spark = open_session(self.url)
        session_s = time.monotonic() - started
        self.tag = f"aeo-{batch_id.pipeline_id}-{batch_id.seq}"
        watch = FenceWatch(self.coordinator.ledger, batch_id, on_fenced=lambda _reason: self.kill())
        try:
            self.spark.addTag(self.tag)
            with tempfile.TemporaryDirectory(prefix="exactly-once-connect-") as folder:
                name = self.transform if isinstance(self.transform, str) else None
                self.spark.addArtifacts(str(build_bundle(folder, name).py_files), pyfile=True)
            summary = run_write(self.spark, self.coordinator, batch_id, transform=self.transform,
                                on_claimed=lambda claimed: self._claimed(claimed, watch))
            summary["seconds"] = {"spark_session": round(session_s, 3), "total": round(time.monotonic() - started, 3)}
            return summary
        except Exception as exc:
            raise watch.explain(explain(exc, self.url)) from exc
        finally:
            watch.stop()
            close_session(self.spark)

    def _claimed(self, batch: Batch, watch: FenceWatch) -> None:
        """This attempt holds the batch now: stop what an earlier attempt still runs, record this session."""
        previous = self.coordinator.ledger.get_batch(batch.id).details.get(SESSION_DETAIL)
        if previous and previous != self.spark.session_id:
            self._interrupt(previous, batch.id)
        self.coordinator.ledger.update_details(batch.id, **{SESSION_DETAIL: self.spark.session_id})
        watch.start(batch)

    def _interrupt(self, session_id: str, batch_id: BatchId) -> None:
        """Interrupt what an earlier attempt of this batch runs on the server (its task may be dead)."""
        try:
            old = open_session(session_url(self.url, session_id))
            interrupted = old.interruptAll()
            release_only(old)
            if interrupted:
                self.log.warning("interrupted %d operation(s) an earlier attempt of batch %s left running on %s",
                                 len(interrupted), batch_id, self.url)
        except Exception as exc:  # the session is gone already (ended, server restarted): nothing runs there
            self.log.info("the earlier attempt's Spark Connect session %s is gone (%s)", session_id,
                          _first_line(str(exc)))

    def kill(self) -> None:
        """Interrupt this attempt's operations on the server (on_kill, or fenced by a newer attempt)."""
        if self.spark is not None and self.tag is not None:
            try:
                self.spark.interruptTag(self.tag)
            except Exception as exc:
                self.log.warning("could not interrupt the Spark Connect operations of this attempt: %s", exc)
