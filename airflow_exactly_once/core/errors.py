"""Errors of the protocol. Each says whether retrying the same step can help.

Airflow retries a failed task; a `retriable=False` error should instead fail the task
for good (the operators turn it into AirflowFailException) so that nobody waits on a
retry that cannot succeed.
"""

from __future__ import annotations

from typing import Iterable, NoReturn

__all__ = [
    "ExactlyOnceError",
    "ConfigurationError",
    "MissingExtraError",
    "LedgerVersionError",
    "HandlesVersionError",
    "FencedError",
    "IllegalTransitionError",
    "SourceUnavailableError",
    "DataLossError",
    "TransformError",
    "BadRecordsError",
    "SinkError",
    "TransactionLostError",
    "IntervalNotOverError",
]


class ExactlyOnceError(Exception):
    """Base class. `retriable` tells the operator whether an Airflow retry makes sense."""

    retriable: bool = False

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


class ConfigurationError(ExactlyOnceError):
    """The pipeline is configured in a way that cannot work; the message says what to change."""


class MissingExtraError(ConfigurationError):
    """A feature needs a dependency that only an extra of the package installs; the message names the extra."""

    def __init__(self, feature: str, extra: str, missing: str | None = None) -> None:
        self.extra = extra
        what = f" (module {missing!r} is not installed)" if missing else ""
        super().__init__(f"{feature} needs the [{extra}] extra{what}: "
                         f"pip install 'airflow-exactly-once[{extra}]'")


class LedgerVersionError(ConfigurationError):
    """The ledger's schema is not the version this provider's code reads (older for a reader, or newer than known)."""


class HandlesVersionError(ConfigurationError):
    """A batch's handles in the ledger are in a format this release cannot read (written by a newer one).

    Never guessed at: misreading a PREPARED batch's handles could commit the wrong output or lose it.
    """


class FencedError(ExactlyOnceError):
    """Another run (or a newer attempt) took the pipeline or the batch over; this one must stop."""


class IllegalTransitionError(ExactlyOnceError):
    """A batch state change that the transition table does not allow."""


class SourceUnavailableError(ExactlyOnceError):
    """Kafka could not be reached or answered with an error; usually worth a retry."""

    retriable = True


class DataLossError(ExactlyOnceError):
    """Planned offsets are no longer in the topic (retention, deletion, recreation)."""


class TransformError(ExactlyOnceError):
    """The user's transform raised or returned something other than a DataFrame."""


class BadRecordsError(ExactlyOnceError):
    """A batch holds records its bad_record_policy (or max_bad_records) does not let through."""


class SinkError(ExactlyOnceError):
    """The sink rejected the output or could not commit it."""


class TransactionLostError(SinkError):
    """A batch's staged output is gone and was never committed: every sink raises this one error for it.

    What was lost travels with it, for logs and tools as well as in the message: `sink` (its type, "kafka"),
    `batch` (the batch's seq; None where the loss is found below the level of batches, e.g. one Kafka
    transaction), `lost` (the transactional ids, prepared GIDs, staged folder or snapshot) and `reason` (why).
    Not retriable: committing cannot succeed any more. notify_complete and recovery answer it by aborting
    the batch, and the next run processes its range again.
    """

    def __init__(self, message: str, *, sink: str | None = None, batch: int | None = None,
                 lost: Iterable[str] = (), reason: str | None = None, retriable: bool | None = None) -> None:
        super().__init__(message, retriable=retriable)
        self.sink = sink
        self.batch = batch
        self.lost = tuple(lost)
        self.reason = reason

    def restated(self, message: str, *, batch: int | None = None) -> "TransactionLostError":
        """The same loss told anew (a caller adds what it did about it, or the batch it was part of)."""
        return TransactionLostError(message, sink=self.sink, batch=self.batch if batch is None else batch,
                                    lost=self.lost, reason=self.reason, retriable=self.retriable)


class IntervalNotOverError(ExactlyOnceError):
    """Interval mode: the run's data interval has not ended yet, so its records are not all there."""

    retriable = True


def error_to_dict(exc: BaseException) -> dict[str, object]:
    """An error as plain data, to cross a process boundary (executor -> driver, spark-submit job -> task)."""
    retriable = exc.retriable if isinstance(exc, ExactlyOnceError) else True
    # A sink's own subclass (e.g. PostgresTransactionError) travels as the class of ours it extends.
    ours = next((c for c in type(exc).__mro__ if globals().get(c.__name__) is c), type(exc))
    return {"type": ours.__name__, "retriable": retriable, "message": str(exc)[:4000]}


def error_from_dict(data: dict[str, object]) -> ExactlyOnceError:
    """The error error_to_dict() described: the same class and retriability when it is one of ours."""
    cls = globals().get(str(data.get("type", "")))
    message = str(data.get("message", ""))
    retriable = bool(data.get("retriable", True))
    if isinstance(cls, type) and issubclass(cls, ExactlyOnceError):
        return cls(message, retriable=retriable)
    return ExactlyOnceError(f"{data.get('type')}: {message}", retriable=retriable)


def raise_explained(explained: BaseException, cause: BaseException) -> NoReturn:
    """Raise `explained` caused by `cause`; when nothing was explained (the same object), raise `cause` as it is.

    `raise exc from exc` would make the error its own cause and drop the real one (a gRPC
    UNAVAILABLE under Spark Connect's RETRIES_EXCEEDED, say).
    """
    if explained is cause:
        raise cause
    raise explained from cause
