"""Hanging transactions (KIP-664) on a real broker: the pipeline ends its own, and names what it must not end.

The hanging transactions come from a real fault, made deterministic: the transaction coordinator's state
is lost (the broker stopped, its `__transaction_state` logs removed, started again), as an unclean
election on `__transaction_state` or a lost disk leaves it. The output partitions then hold the batch's
transactions open with no coordinator that knows them, and their last stable offset stays put for good:
read_committed consumers see nothing after it. The broker is this module's own: losing its coordinator
state would disturb the transactions of other tests.

The write step here is the Spark job's without Spark (the batch's records read with the production range
reader, written by the sink's partition writer): the subject is what commit, recovery and abort do.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

import pytest
from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import AbortTransactionSpec

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import SinkError, TransactionLostError
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.range_read import read_ranges
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks.kafka.committable import KafkaCommittable
from airflow_exactly_once.sinks.kafka.writer import KafkaPartitionWriter
from devtools.kafka_broker import LocalKafkaBroker
from tests.harness import Pipe, open_ledger
from tests.helpers import assert_exactly_once, create_topic, produce
from tests.kafka_helpers import lose_coordinator_state, read_all, settled_ends


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    broker = LocalKafkaBroker(tmp_path_factory.mktemp("kafka-hanging")).start()
    yield broker
    broker.stop()


@dataclass
class Scene:
    """A pipeline left in one state when the coordinator lost its transactions."""

    pipe: Pipe
    output: str
    sent: list[str]
    first: Batch  # its first batch, as planned


@pytest.fixture(scope="module")
def scenes(broker, tmp_path_factory) -> dict[str, Scene]:
    """Three pipelines, then one loss of the coordinator's state (a broker restart) for all of them: two with a
    PREPARED batch (for notify_complete, for the next run's recovery), one whose write attempt died after opening
    its transactions and before the ledger recorded them."""
    folder = tmp_path_factory.mktemp("hanging-ledgers")
    made = {}
    for scene in ("notify", "recovery", "unrecorded"):
        pipe, _, output, sent = new_pipe(broker, folder)
        first = pipe.plan("run-1").batch
        if scene == "unrecorded":
            stage(pipe, first.id)
        else:
            write(pipe, first.id)
        made[scene] = Scene(pipe, output, sent, first)
    lose_coordinator_state(broker)
    return made


def new_pipe(broker, tmp_path) -> tuple[Pipe, str, str, list[str]]:
    name = f"hang-{uuid.uuid4().hex[:8]}"
    source, output = f"{name}-in", f"{name}-out"
    create_topic(broker.bootstrap_servers, source, partitions=2)
    create_topic(broker.bootstrap_servers, output, partitions=2)
    sent = produce(broker.bootstrap_servers, source, 40, partitions=2)
    config = checked(PipelineConfig(pipeline_id=name, topics=[source], sink={"type": "kafka", "topic": output},
                                    bootstrap_servers=broker.bootstrap_servers))
    pipe = Pipe(config, open_ledger(tmp_path / f"{name}.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)))
    return pipe, source, output, sent


def stage(pipe: Pipe, batch_id: BatchId) -> tuple[object, KafkaCommittable]:
    """The write's claim and staging: the batch's records into one open transaction per input partition."""
    batch = pipe.claim(batch_id)
    settings = KafkaSettings.of(pipe.config)
    rows = read_ranges(settings, "hanging-test", batch.ranges)
    writer = KafkaPartitionWriter(pipe.config.sink["topic"], "EXACTLY_ONCE", pipe.config.pipeline_id, batch.seq,
                                  120_000, settings, {})
    reports = [writer.write_records(r.partition, [(row[0], row[1]) for row in rows if row[3] == r.partition])
               for r in batch.ranges if r.size]
    return batch, KafkaCommittable("EXACTLY_ONCE", settings.bootstrap_servers, pipe.config.sink["topic"],
                                   tuple(reports))


def write(pipe: Pipe, batch_id: BatchId) -> None:
    batch, committable = stage(pipe, batch_id)
    pipe.coordinator.prepare(batch, committable, batch.offset_span, batch.offset_span)


def stuck(broker, output: str) -> bool:
    """Does the output hold an open transaction (last stable offset below the high watermark)?"""
    try:
        settled_ends(broker.bootstrap_servers, output, timeout_s=3)
    except AssertionError:
        return True
    return False


def test_a_prepared_batch_whose_coordinator_forgot_it_is_ended_lost_and_processed_again(broker, scenes):
    """notify_complete finds the batch's transactions hanging (open in the partitions, unknown to the coordinator,
    never committed by the ledger, no commit marker anywhere): it aborts them, the batch is lost, the next run
    processes the same range and the output is exact."""
    pipe, output, first = scenes["notify"].pipe, scenes["notify"].output, scenes["notify"].first
    assert stuck(broker, output)

    with pytest.raises(TransactionLostError, match="processed again by the next run"):
        pipe.new_coordinator().commit(first.id)  # notify_complete, in a fresh process
    assert pipe.state(first.id) is BatchState.ABORTED
    assert not stuck(broker, output)  # the abort markers reached every partition

    again = pipe.plan("run-2").batch  # the next run processes the range again
    assert again.ranges == first.ranges
    write(pipe, again.id)
    assert "COMMITTED" in pipe.commit(again.id)
    assert_exactly_once(scenes["notify"].sent, read_all(broker.bootstrap_servers, output))


def test_recovery_ends_the_hanging_transactions_of_a_batch_left_prepared(broker, scenes):
    """The same fault found by the next run's plan (recovery) instead of notify_complete."""
    pipe, output, first = scenes["recovery"].pipe, scenes["recovery"].output, scenes["recovery"].first
    assert stuck(broker, output)

    planned = pipe.plan("run-2")
    assert pipe.coordinator.recovery_lost == [first.id]
    assert planned.batch.ranges == first.ranges
    assert not stuck(broker, output)
    write(pipe, planned.batch.id)
    pipe.commit(planned.batch.id)
    assert_exactly_once(scenes["recovery"].sent, read_all(broker.bootstrap_servers, output))


def test_a_hanging_transaction_the_ledger_never_recorded_is_not_aborted_but_named_with_its_command(broker, scenes):
    """A write attempt died after it opened its transactions and before the ledger recorded them; then the
    coordinator lost its state. Nothing shows the producer is the pipeline's: the abort task fails for good,
    naming the partition, producer id, epoch and the command; once an operator ran it, the pipeline goes on."""
    pipe, output, first = scenes["unrecorded"].pipe, scenes["unrecorded"].output, scenes["unrecorded"].first

    with pytest.raises(SinkError) as refused:
        pipe.new_coordinator().abort(first.id, "the write failed")  # the abort task
    message = str(refused.value)
    assert refused.value.retriable is False
    assert "is not one this pipeline's ledger recorded" in message
    commands = re.findall(r"kafka-transactions\.sh --bootstrap-server (\S+) abort --topic (\S+) --partition (\d+) "
                          r"--producer-id (\d+) --producer-epoch (\d+) --coordinator-epoch (\d+)", message)
    assert {(c[1], int(c[2])) for c in commands} == {(output, 0), (output, 1)}
    assert all(c[0] == broker.bootstrap_servers for c in commands)
    assert stuck(broker, output)  # nothing was aborted

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)  # the operator runs the commands
    try:
        for _, topic, partition, pid, epoch, coordinator_epoch in commands:
            admin.abort_transaction(AbortTransactionSpec(TopicPartition(topic, int(partition)), int(pid), int(epoch),
                                                         int(coordinator_epoch)))
    finally:
        admin.close()
    assert "ABORTED" in pipe.new_coordinator().abort(first.id, "the write failed")  # the cleared abort task

    planned = pipe.plan("run-2").batch
    assert planned.ranges == first.ranges
    write(pipe, planned.id)
    pipe.commit(planned.id)
    assert_exactly_once(scenes["unrecorded"].sent, read_all(broker.bootstrap_servers, output))
