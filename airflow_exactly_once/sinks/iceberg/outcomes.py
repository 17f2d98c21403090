"""How the Iceberg sink names what went wrong with its catalog: errors whose messages say what to change.

Kept apart from the catalog clients (catalog.py, rest_client.py) and the committer, which all raise them.
"""

from __future__ import annotations

from airflow_exactly_once.core.errors import SinkError


class CommitOutcomeUnknown(SinkError):
    """The catalog may have applied a commit whose answer never arrived (server killed, connection dropped,
    timeout, 5xx): retried, the commit reads the table's snapshots first and finds the batch if it landed."""

    retriable = True


def outcome_unknown(table: str, what: str, where: str, exc: Exception) -> CommitOutcomeUnknown:
    return CommitOutcomeUnknown(
        f"{what}: the outcome of the commit to table {table} is unknown ({where} gave no answer: "
        f"{type(exc).__name__}: {str(exc)[:300]}); nothing was deleted. The retry reads the table's snapshots: a "
        "batch whose commit landed is found in main's history (its snapshot summary) and is not committed again")
