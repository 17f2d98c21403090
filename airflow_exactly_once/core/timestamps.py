"""One notion of time for the ledger and Kafka: milliseconds since the epoch, UTC.

Kafka record timestamps and `offsets_for_times` use epoch milliseconds; Airflow hands
out aware datetimes; people type ISO-8601. Everything is converted here, once.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from airflow_exactly_once.core.errors import ConfigurationError


def to_epoch_ms(value: Any, what: str = "timestamp") -> int:
    """Epoch milliseconds from an int/float (ms), a digit string, an ISO-8601 string or a datetime.

    Naive datetimes and ISO strings without an offset are taken as UTC.
    """
    if isinstance(value, bool) or value is None or value == "":
        raise ConfigurationError(f"{what} is missing: give epoch milliseconds or an ISO-8601 time "
                                 "such as '2024-05-01T12:00:00Z'")
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return int(round(moment.timestamp() * 1000))
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return to_epoch_ms(datetime.fromisoformat(text.replace("Z", "+00:00")), what)
    except ValueError:
        raise ConfigurationError(f"{what} {value!r} is not a time: give epoch milliseconds or an ISO-8601 "
                                 "time such as '2024-05-01T12:00:00Z'") from None


def iso(ms: int | None) -> str:
    """Epoch milliseconds as a readable UTC time (for logs, the CLI and error messages)."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def now_ms() -> int:
    return int(datetime.now(timezone.utc).timestamp() * 1000)
