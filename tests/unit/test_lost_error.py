"""One lost-output error for every sink, carrying what was lost; the protocol aborts the batch on it.

The sinks' real losses (a timed-out Kafka transaction, a rolled-back GID, an expired snapshot)
are raised against the real systems in tests/integration (test_sink_contract's lost prepare,
test_kafka_transactions, test_postgres_transactions); here the error itself and its way
through notify_complete on a real ledger with the file sink.
"""

from __future__ import annotations

import shutil

import pytest

from airflow_exactly_once.core.errors import SinkError, TransactionLostError, error_from_dict, error_to_dict
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.sinks.kafka import transaction_errors as kafka_transaction_errors
from airflow_exactly_once.sinks.kafka.transaction_errors import transaction_lost
from airflow_exactly_once.sinks.kafka.transaction_handle import TransactionHandle
from airflow_exactly_once.sinks.postgres import errors as postgres_errors
from tests.harness import FakeSource, MarkerWriter, Pipe, open_ledger, pipeline_config


def test_it_carries_what_was_lost_and_is_not_retriable():
    lost = TransactionLostError("gone", sink="postgres", batch=4, lost=["g1", "g2"], reason="rolled back")
    assert (lost.sink, lost.batch, lost.lost, lost.reason) == ("postgres", 4, ("g1", "g2"), "rolled back")
    assert lost.retriable is False and isinstance(lost, SinkError)
    told = lost.restated("gone. Batch 4 is now ABORTED")
    assert str(told) == "gone. Batch 4 is now ABORTED" and told.retriable is False
    assert (told.sink, told.batch, told.lost, told.reason) == ("postgres", 4, ("g1", "g2"), "rolled back")
    assert TransactionLostError("one txn", sink="kafka").restated("one txn of batch 9", batch=9).batch == 9


def test_it_crosses_a_process_boundary_as_itself():
    back = error_from_dict(error_to_dict(TransactionLostError("gone", sink="parquet", batch=1)))
    assert type(back) is TransactionLostError and back.retriable is False and str(back) == "gone"


def test_a_kafka_transaction_the_broker_refuses_is_the_core_error():
    handle = TransactionHandle("orders-7-0", 4001, 2)
    lost = transaction_lost(handle, "ProducerFencedError: a newer producer epoch exists")
    assert isinstance(lost, TransactionLostError) and lost.retriable is False
    assert (lost.sink, lost.batch, lost.lost) == ("kafka", None, ("orders-7-0",))
    assert "'orders-7-0' (producer_id=4001, epoch=2) can no longer be committed: ProducerFencedError" in str(lost)


@pytest.mark.parametrize("module", [kafka_transaction_errors, postgres_errors])
def test_the_transaction_modules_have_no_lost_error_of_their_own(module):
    own = [name for name, value in vars(module).items()
           if isinstance(value, type) and issubclass(value, Exception) and "Lost" in name
           and value is not TransactionLostError]
    assert own == [] and "TransactionLost" not in module.__all__


def test_notify_complete_aborts_a_lost_batch_and_says_what_was_lost(tmp_path):
    config = pipeline_config("p", ["t"], {"type": "parquet", "path": str(tmp_path / "out")})
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: FakeSource({("t", 0): 10}),
                writer_factory=MarkerWriter.of)
    batch = pipe.plan("r1").batch
    staging = pipe.write(batch.id).handles["staging"]
    shutil.rmtree(staging)  # e.g. a cleanup job emptied _staging
    with pytest.raises(TransactionLostError, match="processed again by the next run") as lost:
        pipe.commit(batch.id)
    assert (lost.value.sink, lost.value.batch, lost.value.lost) == ("parquet", batch.seq, (staging,))
    assert lost.value.reason == "the staged folder was removed" and lost.value.retriable is False
    assert pipe.state(batch.id) is BatchState.ABORTED
