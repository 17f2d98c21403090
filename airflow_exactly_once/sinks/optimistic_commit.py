"""The retry loop of a table format's optimistic commit (Iceberg, Delta Lake).

A commit to such a table is made against the version the writer read; when another writer
committed first, the format refuses it and the writer reads the table again and retries. The
loop is the same for every format: what differs is how the table is loaded, which exception
means "beaten by another commit", and how other failures are explained.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, TypeVar

from airflow_exactly_once.core.errors import SinkError

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_COMMIT_ATTEMPTS = 10


def commit_with_retries(what: str, load: Callable[[], Any], step: Callable[[Any], T], *,
                        beaten: type[BaseException] | tuple[type[BaseException], ...], where: str,
                        explain: Callable[[Exception], Exception | None] | None = None,
                        attempts: int = MAX_COMMIT_ATTEMPTS) -> T:
    """Run `step(load())` until its commit is not beaten by another writer (`beaten`), backing off up to 2 s.

    `explain` turns another failure into the error to raise instead (None: raise it as it is); after
    `attempts` beaten commits a retriable SinkError names `where` the writers kept winning.
    """
    for attempt in range(attempts):
        table = load()
        try:
            return step(table)
        except beaten as exc:
            log.info("%s: another commit won (%s); reading the table again", what, exc)
            time.sleep(min(0.05 * 2 ** attempt, 2.0))
        except SinkError:
            raise
        except Exception as exc:
            failure = explain(exc) if explain is not None else None
            if failure is not None:
                raise failure from exc
            raise
    raise SinkError(f"{what}: other writers kept committing to {where} first; retry", retriable=True)
