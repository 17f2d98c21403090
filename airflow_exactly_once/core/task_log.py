"""The logger a step writes to: Python's `logging.Logger`, or the structlog logger Airflow gives a task (`self.log`).

Both take printf-style messages; the steps use nothing else of either, so they accept both.
"""

from __future__ import annotations

from typing import Any, Protocol


class TaskLog(Protocol):
    """A logger's printf-style calls, at the levels the steps log at."""

    def debug(self, msg: Any, /, *args: Any) -> Any: ...

    def info(self, msg: Any, /, *args: Any) -> Any: ...

    def warning(self, msg: Any, /, *args: Any) -> Any: ...
