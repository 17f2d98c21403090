"""Batch states and the only transitions between them (docs/protocol.md, "Batch states")."""

from __future__ import annotations

import enum

from airflow_exactly_once.core.errors import IllegalTransitionError


class BatchState(str, enum.Enum):
    PLANNED = "PLANNED"  # the offset range is fixed; nothing written yet
    PREPARED = "PREPARED"  # output is pre-committed in the sink; handles recorded
    COMMITTED = "COMMITTED"  # sink committed; offsets advanced
    ABORTED = "ABORTED"  # output discarded; the range goes back to the next batch (terminal)
    # A run found nothing to write. Recorded (never planned) so that the ledger shows the
    # run; its ranges are empty and sit at the position the run saw (terminal).
    EMPTY = "EMPTY"
    # Committed output later withdrawn from the sink on purpose: a rewind, or a re-run of
    # the same data interval that replaced it. Its range no longer counts (terminal).
    RETRACTED = "RETRACTED"

    @property
    def terminal(self) -> bool:
        return not TRANSITIONS[self]


# States a batch row may be created in (everything else is reached by a transition).
INITIAL_STATES: frozenset[BatchState] = frozenset({BatchState.PLANNED, BatchState.EMPTY})

TRANSITIONS: dict[BatchState, frozenset[BatchState]] = {
    BatchState.PLANNED: frozenset({BatchState.PREPARED, BatchState.ABORTED}),
    # PREPARED -> ABORTED only when the sink reports the pre-committed output lost.
    BatchState.PREPARED: frozenset({BatchState.COMMITTED, BatchState.ABORTED}),
    # COMMITTED -> RETRACTED only by a recorded rewind or an interval replacement.
    BatchState.COMMITTED: frozenset({BatchState.RETRACTED}),
    BatchState.ABORTED: frozenset(),
    BatchState.EMPTY: frozenset(),
    BatchState.RETRACTED: frozenset(),
}


def check_transition(current: BatchState, target: BatchState) -> None:
    if target not in TRANSITIONS[current]:
        raise IllegalTransitionError(f"a batch cannot go from {current.value} to {target.value}")


def check_initial(state: BatchState) -> None:
    if state not in INITIAL_STATES:
        raise IllegalTransitionError(f"a batch cannot be created as {state.value}")
