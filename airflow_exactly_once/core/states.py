"""Batch states and the only transitions between them (DESIGN section 2)."""

from __future__ import annotations

import enum

from airflow_exactly_once.core.errors import IllegalTransitionError


class BatchState(str, enum.Enum):
    PLANNED = "PLANNED"  # the offset range is fixed; nothing written yet
    PREPARED = "PREPARED"  # output is pre-committed in the sink; handles recorded
    COMMITTED = "COMMITTED"  # sink committed; offsets advanced (terminal)
    ABORTED = "ABORTED"  # output discarded; the range goes back to the next batch (terminal)

    @property
    def terminal(self) -> bool:
        return self in (BatchState.COMMITTED, BatchState.ABORTED)


TRANSITIONS: dict[BatchState, frozenset[BatchState]] = {
    BatchState.PLANNED: frozenset({BatchState.PREPARED, BatchState.ABORTED}),
    # PREPARED -> ABORTED only when the sink reports the pre-committed output lost.
    BatchState.PREPARED: frozenset({BatchState.COMMITTED, BatchState.ABORTED}),
    BatchState.COMMITTED: frozenset(),
    BatchState.ABORTED: frozenset(),
}


def check_transition(current: BatchState, target: BatchState) -> None:
    if target not in TRANSITIONS[current]:
        raise IllegalTransitionError(f"a batch cannot go from {current.value} to {target.value}")
