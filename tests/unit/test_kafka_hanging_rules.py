"""The rules that decide whether a hanging Kafka transaction may be aborted (sinks.kafka.hanging).

Pure decisions: what a coordinator's answer means for a transaction a partition holds open, and when an
abort marker cannot take back a commit. The real-broker cases are tests/integration/test_kafka_hanging.py.
"""

from __future__ import annotations

import pytest

from airflow_exactly_once.sinks.kafka.hanging import (
    CoordinatorView,
    Hanging,
    OpenTransaction,
    Outcome,
    Owner,
    why_not_abort,
)

OPEN = OpenTransaction("out", 0, producer_id=7, epoch=3, coordinator_epoch=-1, start_offset=240)


@pytest.mark.parametrize("view, listed, outcome", [
    (CoordinatorView("p-2-0", "Ongoing", 7, 3), True, Outcome.UNDER_WAY),
    (CoordinatorView("p-2-0", "PrepareCommit", 7, 3), False, Outcome.UNDER_WAY),
    (CoordinatorView("p-2-0", "PrepareAbort", 7, 3), False, Outcome.UNDER_WAY),
    # Ongoing without this partition, or at a newer epoch: the open one is another, older transaction.
    (CoordinatorView("p-2-0", "Ongoing", 7, 3), False, Outcome.UNKNOWN),
    (CoordinatorView("p-2-0", "Ongoing", 7, 4), True, Outcome.UNKNOWN),
    # The case: the coordinator aborted it on timeout (a bumped epoch), the markers never arrived.
    (CoordinatorView("p-2-0", "CompleteAbort", 7, 4), False, Outcome.ABORTED),
    (CoordinatorView("p-2-0", "CompleteCommit", 7, 3), False, Outcome.COMMITTED),
    (CoordinatorView("p-2-0", "CompleteCommit", 7, 5), False, Outcome.UNKNOWN),  # a later transaction's commit
    (CoordinatorView("p-2-0", "Empty", 7, 4), False, Outcome.UNKNOWN),
    (CoordinatorView("p-2-0", "Dead", 7, 4), False, Outcome.UNKNOWN),
    (CoordinatorView("p-2-0", "CompleteAbort", 9, 0), False, Outcome.UNKNOWN),  # the id moved to another producer
    (CoordinatorView(), False, Outcome.UNKNOWN),  # no coordinator knows the producer (its state was lost)
])
def test_what_the_coordinator_says_of_an_open_transaction(view, listed, outcome):
    assert view.outcome(OPEN, listed) is outcome


def hanging(outcome: Outcome, txn: OpenTransaction = OPEN) -> Hanging:
    return Hanging(txn, CoordinatorView(), outcome)


# Batch 2 wrote two transactions: producer 7 into out[0] and out[1], producer 8 into out[1].
WRITES = ((7, "out", 0, 240), (7, "out", 1, 197), (8, "out", 1, 192))
ALL_OPEN = frozenset({(7, "out", 0), (7, "out", 1), (8, "out", 1)})


def never_asked(topic, partition, offset):
    raise AssertionError(f"visibility of {topic}[{partition}]@{offset} was not needed")


def test_an_aborted_transaction_of_an_uncommitted_batch_is_aborted_without_reading_anything():
    assert why_not_abort(hanging(Outcome.ABORTED), Owner(2, False, WRITES), frozenset(), never_asked) is None


def test_an_unknown_transaction_is_aborted_when_no_partition_of_its_batch_has_a_marker():
    assert why_not_abort(hanging(Outcome.UNKNOWN), Owner(2, False, WRITES), ALL_OPEN, never_asked) is None


def test_an_unknown_transaction_is_aborted_when_the_closed_partitions_show_aborts():
    asked = []

    def aborted(topic, partition, offset):
        asked.append((topic, partition, offset))
        return False

    assert why_not_abort(hanging(Outcome.UNKNOWN), Owner(2, False, WRITES), ALL_OPEN - {(8, "out", 1)}, aborted) is None
    assert asked == [("out", 1, 192)]


def test_a_commit_marker_in_any_partition_of_the_batch_forbids_the_abort():
    why = why_not_abort(hanging(Outcome.UNKNOWN), Owner(2, False, WRITES), ALL_OPEN - {(8, "out", 1)},
                        lambda t, p, o: True)
    assert "out[1] shows batch 2's records of producer id 8 committed" in why


def test_a_partition_whose_outcome_cannot_be_read_forbids_the_abort():
    why = why_not_abort(hanging(Outcome.UNKNOWN), Owner(2, False, WRITES), ALL_OPEN - {(7, "out", 1)},
                        lambda t, p, o: None)
    assert "cannot be told" in why and "producer id 7" in why


@pytest.mark.parametrize("outcome", [Outcome.ABORTED, Outcome.UNKNOWN])
def test_a_batch_the_ledger_committed_is_never_aborted(outcome):
    why = why_not_abort(hanging(outcome), Owner(2, True, WRITES), ALL_OPEN, never_asked)
    assert "the ledger says batch 2, which wrote it, was committed" in why


def test_a_transaction_the_coordinator_committed_is_never_aborted():
    why = why_not_abort(hanging(Outcome.COMMITTED), Owner(2, False, WRITES), ALL_OPEN, never_asked)
    assert "would take back committed records" in why


def test_a_producer_the_ledger_never_recorded_is_never_aborted():
    why = why_not_abort(hanging(Outcome.ABORTED), None, ALL_OPEN, never_asked)
    assert "producer id 7 is not one this pipeline's ledger recorded" in why


def test_the_command_an_operator_runs():
    assert OPEN.abort_command("b1:9092,b2:9092") == (
        "kafka-transactions.sh --bootstrap-server b1:9092,b2:9092 abort --topic out --partition 0 "
        "--producer-id 7 --producer-epoch 3 --coordinator-epoch 0")
