"""The errors of the PostgreSQL sink's two-phase commit steps, and what a server error means for a retry.

Every step (connect, prepare, commit, roll back) fails with a PostgresTransactionError, a SinkError whose
``retriable`` says whether trying again can help; :func:`is_retriable` tells that from the server's SQLSTATE.
They live apart from the steps so that each step's module, and the messages of sinks.postgres.diagnosis,
can raise them without importing another step.
"""

from __future__ import annotations

import re

from airflow_exactly_once.core.errors import SinkError
from airflow_exactly_once.sinks.postgres.driver import psycopg2


__all__ = [
    "PostgresTransactionError",
    "TwoPhaseNotSupported",
    "PrepareFailed",
    "two_phase_error",
]

# SQLSTATE classes after which trying again can succeed.
_RETRIABLE_CLASSES = ("08", "40", "53", "57", "58")
_RETRIABLE_STATES = {"55006", "55P03", "42710"}  # object in use, lock not available, GID in use
_NOT_RETRIABLE_STATES = {"53200"}  # max_prepared_transactions reached: needs an operator


class PostgresTransactionError(SinkError):
    """A two-phase commit step failed; a SinkError, so ``retriable`` tells whether trying again can help."""

    def __init__(self, message: str, *, retriable: bool = False, sqlstate: str | None = None) -> None:
        super().__init__(message, retriable=retriable)
        self.sqlstate = sqlstate


class TwoPhaseNotSupported(PostgresTransactionError):
    """The server has ``max_prepared_transactions = 0``."""


class PrepareFailed(PostgresTransactionError):
    """Writing or preparing a partition's rows failed; nothing was left prepared."""


def is_retriable(exc: psycopg2.Error) -> bool:
    code = exc.pgcode
    if code is None:  # no server reply: the connection failed
        return isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError))
    if code in _NOT_RETRIABLE_STATES:
        return False
    return code in _RETRIABLE_STATES or code[:2] in _RETRIABLE_CLASSES


def server_message(exc: psycopg2.Error) -> str:
    text = (exc.pgerror or str(exc)).strip()
    return re.sub(r"\s+", " ", text)


def two_phase_error(where: str, setting: int | str = 0) -> TwoPhaseNotSupported:
    return TwoPhaseNotSupported(
        f"PostgreSQL at {where} has max_prepared_transactions = {setting}, so PREPARE TRANSACTION "
        "(two-phase commit) is disabled and exactly-once writes are impossible. Fix: set "
        "max_prepared_transactions in postgresql.conf (or ALTER SYSTEM SET max_prepared_transactions = 64) "
        "to at least the number of partitions written at once, plus headroom, and restart the server "
        "(a reload is not enough).",
        retriable=False,
    )
