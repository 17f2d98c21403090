"""A Spark Connect session as the write path uses it: opened with short retries, released without side
effects, and its failures explained in terms of what to change.

Every message names the server as `sc://host:port`, never the token or user of the connection string.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError, raise_explained
from airflow_exactly_once.spark.packages import kafka_package
from airflow_exactly_once.spark.write_failures import lacks_kafka_connector

log = logging.getLogger(__name__)

# The batch details that record the server-side session of the attempt holding the batch, and, when that session
# is the pipeline's shared one (spark.connect_server.pipeline_session), the attempt's operation tag in it.
SESSION_DETAIL = "connect_session"
TAG_DETAIL = "connect_tag"
# A lost server is found out within about half a minute (pyspark's default retries last minutes).
RETRIES, MAX_BACKOFF_MS = 5, 8_000
RELEASE_DRAIN_S = 10.0  # how long closing a client waits for pyspark's queued releases of finished operations


class SparkConnectUnavailable(ExactlyOnceError):
    """The Spark Connect server cannot be reached now; a retry can succeed."""

    retriable = True


def session_url(url: str, session_id: str | None = None) -> str:
    """`url` with a `session_id` parameter (Spark Connect's connection string: sc://host:port/;k=v;...)."""
    if session_id is None:
        return url
    separator = "" if "/;" in url else ("/" if not url.endswith("/") else "")
    return f"{url}{separator};session_id={session_id}"


def server_address(url: str) -> str:
    """`sc://host:port` of a connection string, without its parameters (a token, a user id)."""
    return url.split("/;", 1)[0].split(";", 1)[0].rstrip("/")


def explain(exc: BaseException, url: str) -> BaseException:
    """What went wrong with the server, in terms of what to change; other errors pass unchanged.

    A server error can surface anywhere, also while the transform builds its plan (which our
    own wrapping would call a transform bug), so the whole chain of causes is read.
    """
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and len(chain) < 10 and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    text = " ".join(str(e) for e in chain)
    url = server_address(url)  # never the token or user of the connection string
    if "UNAVAILABLE" in text or "failed to connect to all addresses" in text or "Connection refused" in text:
        reason = next((first_line(str(e)) for e in chain if "UNAVAILABLE" in str(e) or "Connection refused" in str(e)),
                      first_line(text))
        return SparkConnectUnavailable(f"the Spark Connect server at {url} cannot be reached ({reason}): check that it "
                                       "runs and that spark_conn_id / spark.remote points at it")
    if "RETRIES_EXCEEDED" in text:
        return SparkConnectUnavailable(f"the Spark Connect server at {url} stopped answering ({first_line(text)}): "
                                       "check that it runs and that spark_conn_id / spark.remote points at it")
    if "SESSION_CLOSED" in text or "SESSION_NOT_FOUND" in text:
        return SparkConnectUnavailable(f"the write's session on the Spark Connect server at {url} ended (a newer "
                                       f"attempt of the batch closed it, or the server restarted): {first_line(text)}")
    if lacks_kafka_connector(text):
        return ConfigurationError(f"the Spark Connect server at {url} cannot load Spark's Kafka connector: start it "
                                  f"with --packages {kafka_package()} (the server's Spark release), or --jars")
    missing = _missing_module(text)
    if missing is not None:
        return ConfigurationError(f"the Python workers of the Spark Connect server at {url} cannot import {missing!r}: "
                                  "install it in the server's Python (the sinks' writers run there: kafka-python, "
                                  "confluent-kafka, psycopg2, pyarrow)")
    return exc


def first_line(text: str) -> str:
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
        raise SparkConnectUnavailable(f"the Spark Connect server at {server_address(url)} does not accept "
                                      "connections: check that it runs and that spark_conn_id / spark.remote points "
                                      "at it")
    try:
        spark = SparkSession.builder.remote(url).create()
    except Exception as exc:
        raise_explained(explain(exc, url), exc)
    spark.client.set_retry_policies([DefaultPolicy(max_retries=RETRIES, max_backoff=MAX_BACKOFF_MS)])
    _keep_release_pool(spark.client)
    return spark


def close_session(spark: Any, release: bool = True) -> None:
    """Close the client's channel, and release the session on the server unless other clients share it (`release`
    False: it stays for the pipeline's next write); a server that is gone already is no error."""
    drain_releases()
    if not release:
        _detach(spark)
        return
    try:
        spark.stop()
    except Exception as exc:
        log.info("could not release the Spark Connect session %s: %s", spark.session_id, first_line(str(exc)))


def drain_releases(timeout_s: float = RELEASE_DRAIN_S) -> None:
    """Wait until pyspark has sent the ReleaseExecute requests it queued for finished operations.

    pyspark releases an operation asynchronously, from a process-wide thread pool, after its last response.
    A channel closed (or a session released) before that request went out leaves the operation on the
    server: it logs it at INFO when it drops it (released session, or abandoned and expired), its whole
    plan included, and a write's plan carries its pickled partition writer with the secrets it needs
    (docs/secrets.md). One blocked task per pool thread can only all run once every earlier task ended.
    """
    from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator

    pool = getattr(ExecutePlanResponseReattachableIterator, "_release_thread_pool_instance", None)
    if pool is None:
        return
    workers = getattr(pool, "_max_workers", None) or os.cpu_count() or 8
    gate = threading.Barrier(workers + 1, timeout=timeout_s)

    def hold() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            gate.wait()

    try:
        for _ in range(workers):
            pool.submit(hold)
        gate.wait()
    except (RuntimeError, threading.BrokenBarrierError) as exc:  # the pool shut down, or a release hangs
        gate.abort()
        log.info("pyspark's queued ReleaseExecute requests did not all finish in %g s: %s", timeout_s, exc)


def _detach(spark: Any) -> None:
    """What `SparkSession.stop()` does on the client, without its ReleaseSession request (pyspark 3.5 has no
    switch for that): close the channel, and forget the session as the process's default and active one."""
    try:
        spark.client.close()
    except Exception as exc:  # noqa: BLE001 - a channel that cannot close is closed enough
        log.info("could not close the channel to the Spark Connect session %s: %s", spark.session_id,
                 first_line(str(exc)))
    session_class = type(spark)
    if getattr(session_class, "_default_session", None) is spark:
        session_class._default_session = None
    active: Any = getattr(session_class, "_active_session", None)
    if active is not None and getattr(active, "session", None) is spark:
        active.session = None


def _keep_release_pool(client: Any) -> None:
    """Make closing this client leave pyspark's process-wide release thread pool running.

    pyspark 4.0's `SparkConnectClient.close()`, called by `SparkSession.stop()` and by the
    session's `__del__` when it is garbage-collected, shuts that pool down under the running
    operations of the process's other sessions, which then fail with "cannot schedule new
    futures after shutdown" (a fenced attempt's session closing, or the session that stopped an
    earlier attempt being collected, while the attempt that replaced it still writes).
    """
    def close() -> None:
        client._channel.close()
        client._closed = True

    client.close = close
