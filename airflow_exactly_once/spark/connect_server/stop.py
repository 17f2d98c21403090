"""Stop what a write attempt left running on a Spark Connect server, and wait until the server says it ended.

A write task that dies (SIGKILL, a lost worker) leaves its job running on the server: nothing
in the task can stop it, and its partition writers may still open transactions or stage files
after the batch was aborted. `abort`, the recovery in `plan` and a newer write attempt call
`stop_session_operations` with the server-side session the ledger recorded for the attempt and,
in the pipeline's shared session (spark.connect_server.pipeline_session), the attempt's operation
tag: every operation of that attempt (of that session, when the attempt had one of its own) is
interrupted, and each is then followed on the server
(ReattachExecute) until it reports its end (cancelled, failed or finished). An ended operation's
tasks can still run for a moment: Spark notices a cancelled task's interruption within 2 s and
kills its Python worker only `spark.python.task.killTimeout` (2 s) later, and a worker that was
holding rows passes them to its writer meanwhile. So the stop also waits that long (the timeout
read from the server, plus 3 s). Only then is the
sink cleaned up.

pyspark has no public call that waits for an interrupted operation, so the follow-up uses its
client's gRPC stub and request types; `_follow` and `_release` are the places that do, with its own tests
against a real server (tests/integration/test_spark_connect.py).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.spark.connect_server.session import (
    SESSION_DETAIL,
    TAG_DETAIL,
    SparkConnectUnavailable,
    first_line,
    open_session,
    close_session,
    server_address,
    session_url,
)

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 60.0
# Spark's Python runner looks for its task's interruption every 2 s, then waits killTimeout before it kills the
# worker; the task then aborts its files. The stop waits for all of that, plus a margin.
TASK_KILL_MARGIN_S = 3.0
FOLLOW_QUIET_S = 5.0  # an interrupted operation that sends nothing for this long was cancelled (see _follow)
# The server's answers that mean the operation is no longer running (or was never there).
_ENDED = ("OPERATION_CANCELED", "OPERATION_NOT_FOUND", "OPERATION_ABANDONED", "SESSION_NOT_FOUND",
          "SESSION_CLOSED", "OPERATION_ALREADY_COMPLETED")
_SKIPPED_RESPONSE = re.compile(r"position id (\S+) is no longer available")


class AttemptNotStopped(SparkConnectUnavailable):
    """An earlier attempt's operations could not be stopped, or did not end in time; retriable."""


def stop_session_operations(url: str, session_id: str, tag: str | None = None,
                            timeout_s: float = STOP_TIMEOUT_S) -> int:
    """Interrupt the operations tagged `tag` in the server-side session `session_id` (every operation of the session
    when `tag` is None: an attempt's own session, then released) and wait until each ended.

    Returns how many were still running. A session the server no longer has (ended, or the
    server restarted) runs nothing. Raises AttemptNotStopped, naming the server, when the
    server cannot be reached or an operation does not end within `timeout_s`.
    """
    server = server_address(url)
    deadline = time.monotonic() + timeout_s
    try:
        old = open_session(session_url(url, session_id))
    except SparkConnectUnavailable as exc:
        raise AttemptNotStopped(f"cannot stop the operations of session {session_id} on the Spark Connect server at "
                                f"{server}: {exc}") from exc
    try:
        try:
            interrupted = old.interruptAll() if tag is None else old.interruptTag(tag)
        except Exception as exc:
            if _ended(str(exc)):
                return 0
            raise AttemptNotStopped(f"cannot interrupt the operations of session {session_id} on the Spark Connect "
                                    f"server at {server}: {first_line(str(exc))}") from exc
        for operation in interrupted:
            _follow(old.client, session_id, operation, deadline, server)
            _release(old.client, session_id, operation)
        if interrupted:  # an ended operation's tasks may still run until Spark kills their Python workers
            time.sleep(_python_kill_timeout_s(old) + TASK_KILL_MARGIN_S)
        return len(interrupted)
    finally:
        close_session(old, release=tag is None)  # a shared session stays for the pipeline's next write


def stop_batch_attempts(url: str, batch: Batch) -> str:
    """`stop_attempts` of a pipeline that writes on the Spark Connect server at `url` (core.protocol.StopAttempts)."""
    session_id = batch.details.get(SESSION_DETAIL)
    if not session_id:
        return "no write attempt ran on a Spark Connect server"
    running = stop_session_operations(url, session_id, batch.details.get(TAG_DETAIL))
    if running:
        log.warning("stopped %d operation(s) that a dead write attempt of batch %s left running on %s", running,
                    batch.seq, server_address(url))
    return f"stopped {running} operation(s) of the last write attempt on {server_address(url)}"


def _follow(client: Any, session_id: str, operation: str, deadline: float, server: str) -> bool:
    """Wait until the server reports `operation` ended, reattaching to it (its responses up to now are skipped).

    True when the server reported the end; False when it accepted the interrupt but its stream went
    quiet (Spark 4.0 can drop an interrupted operation's last responses once their consumer is gone):
    the job was cancelled by then, and the caller's wait for the tasks' kill covers the rest.
    """
    import grpc
    from pyspark.sql.connect.proto import base_pb2

    last_response: str | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AttemptNotStopped(f"operation {operation} of an earlier write attempt did not end within "
                                    f"{STOP_TIMEOUT_S:g} s of being interrupted on the Spark Connect server at "
                                    f"{server}; its job may still write, so the batch's staged output is left for the "
                                    "next run's recovery to release")
        request = base_pb2.ReattachExecuteRequest(session_id=session_id, operation_id=operation,
                                                  user_context=base_pb2.UserContext(user_id=client._user_id or ""))
        if last_response is not None:
            request.last_response_id = last_response
        try:
            for response in client._stub.ReattachExecute(request, metadata=client._builder.metadata(),
                                                         timeout=min(remaining, FOLLOW_QUIET_S)):
                last_response = response.response_id or last_response
            return True  # the stream ended: the operation finished
        except grpc.RpcError as exc:
            details = exc.details() or ""
            skipped = _SKIPPED_RESPONSE.search(details)
            if skipped is not None:  # the dead client had read this far: follow from the next response
                last_response = skipped.group(1)
                continue
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                log.info("the Spark Connect server at %s accepted the interrupt of operation %s but reports nothing "
                         "more of it", server, operation)
                return False
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                raise AttemptNotStopped(f"the Spark Connect server at {server} went away while operation {operation} "
                                        f"of an earlier write attempt was stopping: {first_line(details)}") from exc
            if _ended(details) or exc.code() == grpc.StatusCode.INTERNAL:
                return True  # cancelled, failed, or no longer on the server
            raise AttemptNotStopped(f"cannot follow operation {operation} on the Spark Connect server at {server}: "
                                    f"{exc.code().name} {first_line(details)}") from exc


def _release(client: Any, session_id: str, operation: str) -> None:
    """Release an ended operation of a dead client: left on the server, it would be logged with its plan (a write's
    pickled partition writer, secrets inside) when the server drops it as abandoned (docs/secrets.md)."""
    from pyspark.sql.connect.proto import base_pb2

    request = base_pb2.ReleaseExecuteRequest(session_id=session_id, operation_id=operation,
                                             user_context=base_pb2.UserContext(user_id=client._user_id or ""),
                                             release_all=base_pb2.ReleaseExecuteRequest.ReleaseAll())
    try:
        client._stub.ReleaseExecute(request, metadata=client._builder.metadata(), timeout=FOLLOW_QUIET_S)
    except Exception as exc:  # noqa: BLE001 - gone already, or the server will drop it later
        log.info("could not release operation %s of an earlier write attempt: %s", operation, first_line(str(exc)))


def _python_kill_timeout_s(spark: Any) -> float:
    """The server's `spark.python.task.killTimeout`: how long a cancelled task's Python worker may go on (it
    passes a held row to its writer meanwhile) before Spark kills it."""
    try:
        value = str(spark.conf.get("spark.python.task.killTimeout", "2s")).strip().lower()
    except Exception:  # noqa: BLE001 - an old server: Spark's default
        value = "2s"
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|m|min)?", value)
    if match is None:
        return 2.0
    scale = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0}[match.group(2)]
    return min(float(match.group(1)) * scale, 60.0)


def _ended(text: str) -> bool:
    return any(marker in text for marker in _ENDED)

