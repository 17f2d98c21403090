"""The Kafka sink against the real broker, and with real Spark where a DataFrame is written.

These drive the sink and the coordinator directly (no Airflow) to reach situations that
Airflow only produces by bad luck: transactions that time out, partly or completely,
a transactional id reused after its commit, a zombie write attempt that wakes up late.
Every output check reads the settled topic under read_committed (what consumers see)
and under read_uncommitted (what was physically written, aborted attempts included).
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from kafka import KafkaConsumer, TopicPartition

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import (
    ConfigurationError,
    FencedError,
    SinkError,
    TransactionLostError,
    TransformError,
)
from airflow_exactly_once.core.model import Batch, OffsetRange
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import create_committer, create_writer
from airflow_exactly_once.sinks.kafka import librdkafka, probe, producer_pool
from airflow_exactly_once.sinks.kafka.committable import KafkaCommittable
from airflow_exactly_once.sinks.kafka.end_txn import abort_transaction, commit_transaction
from airflow_exactly_once.sinks.kafka.kafka_python_producer import open_transaction
from airflow_exactly_once.sinks.kafka.writer import KafkaPartitionWriter
from airflow_exactly_once.spark.partition_writers import run_partition_writers
from tests.harness import Pipe, open_ledger
from tests.helpers import assert_exactly_once, create_topic, produce
from tests.kafka_helpers import (
    read_all,
    settled_ends,
    settled_transaction_state,
    transaction_state,
    wait_transactions_ended,
)


@pytest.fixture(autouse=True)
def no_kept_producers():
    """AT_LEAST_ONCE / NONE writes in this process keep their producer (producer_pool): not past the test."""
    yield
    producer_pool.close_all()


@pytest.fixture
def topics(kafka):
    """A fresh input topic (3 partitions) and output topic (2 partitions)."""
    name = f"ks-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap_servers, f"{name}-in", partitions=3)
    create_topic(kafka.bootstrap_servers, f"{name}-out", partitions=2)
    return name, f"{name}-in", f"{name}-out"


def pipeline(kafka, name: str, source: str, output: str, **overrides) -> PipelineConfig:
    sink = {"type": "kafka", "topic": output, **overrides.pop("sink", {})}
    return checked(PipelineConfig(pipeline_id=name, topics=[source], sink=sink, bootstrap_servers=kafka.bootstrap_servers,
                          **overrides))


def bound_sink(config: PipelineConfig):
    return create_committer(config.sink).bind(config)


def write_batch(config: PipelineConfig, seq: int, parts: dict[int, list[str]],
                timeout_ms: int = 120_000) -> KafkaCommittable:
    """What the Spark job does, partition by partition, without Spark: a pre-committed batch's committable."""
    sink = create_writer(config.sink)
    writer = KafkaPartitionWriter(config.sink["topic"], sink.guarantee, config.pipeline_id, seq, timeout_ms,
                                  KafkaSettings.of(config), sink.output.producer_config)
    reports = [writer.write_records(p, [(v.encode(), v.encode()) for v in values]) for p, values in parts.items()]
    return KafkaCommittable(sink.guarantee, config.bootstrap_servers, config.sink["topic"], tuple(reports))


def fake_batch(config: PipelineConfig, seq: int) -> Batch:
    return Batch(config.pipeline_id, seq, "run", BatchState.PREPARED, 1, ())


def values(n: int, prefix: str = "v") -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


# --------------------------------------------------------------------------- plan-time checks


def test_plan_time_checks_against_the_real_broker(kafka, topics):
    name, source, output = topics
    bound_sink(pipeline(kafka, name, source, output)).check(name)  # fine as it is

    cases = [
        (pipeline(kafka, name, source, "no-such-topic"), "topic 'no-such-topic' does not exist"),
        (pipeline(kafka, name, source, source), f"sink topic {source!r} is also an input topic"),
        (pipeline(kafka, name, source, output, sink={"transaction_timeout_ms": 1_000_000}),
         "above the brokers' transaction.max.timeout.ms=900000"),
    ]
    for config, expected in cases:
        with pytest.raises(ConfigurationError) as error:
            bound_sink(config).check(name)
        assert expected in str(error.value)
    # Without transactions the broker's maximum does not matter.
    bound_sink(pipeline(kafka, name, source, output, guarantee="AT_LEAST_ONCE",
                        sink={"transaction_timeout_ms": 1_000_000})).check(name)
    unreachable = pipeline(kafka, name, source, output, sink={"bootstrap_servers": "127.0.0.1:1",
                                                             "kafka_config": {"bootstrap.timeout.ms": 1500}})
    with pytest.raises(SinkError) as error:
        bound_sink(unreachable).check(name)
    assert error.value.retriable and "127.0.0.1:1" in str(error.value)


# --------------------------------------------------------------------------- the three guarantees


def test_what_each_guarantee_leaves_on_the_topic_after_the_write(kafka, topics):
    name, source, output = topics
    exactly = pipeline(kafka, f"{name}-eo", source, output)
    handles = write_batch(exactly, 1, {0: values(20, "eo"), 1: values(10, "eo2")})
    assert [r.records for r in handles.reports] == [20, 10]
    assert all(r.transaction.started and r.first_offsets for r in handles.reports)
    at_least = write_batch(pipeline(kafka, f"{name}-alo", source, output, guarantee="AT_LEAST_ONCE"), 1,
                           {0: values(5, "alo")})
    assert at_least.reports[0].transaction is None and at_least.reports[0].first_offsets == ()  # nothing to judge
    nothing = write_batch(pipeline(kafka, f"{name}-none", source, output, guarantee="NONE"), 1, {0: values(5, "no")})
    assert nothing.reports[0].first_offsets == ()  # acks=0: the broker never told us anything
    assert KafkaCommittable.from_handles(handles.to_handles()) == handles  # the ledger's JSON, both ways

    # EXACTLY_ONCE output is pre-committed: in the log, invisible to read_committed, holding back the LSO.
    with pytest.raises(AssertionError, match="still has open transactions"):
        settled_ends(kafka.bootstrap_servers, output, timeout_s=2)
    message = bound_sink(exactly).commit(fake_batch(exactly, 1), handles)
    assert "committed 2 Kafka transaction(s)" in message
    committed = read_all(kafka.bootstrap_servers, output)
    assert sorted(committed) == sorted(values(20, "eo") + values(10, "eo2") + values(5, "alo") + values(5, "no"))


def test_at_least_once_tasks_of_one_worker_share_a_producer_until_one_fails(kafka, topics):
    """A Python worker keeps its AT_LEAST_ONCE producer from task to task (sinks.kafka.producer_pool); a task
    whose records were refused fails and does not hand its producer on."""
    name, source, output = topics
    config = pipeline(kafka, f"{name}-alo", source, output, guarantee="AT_LEAST_ONCE")
    producer_pool.close_all()  # what earlier tests of this process left
    write_batch(config, 1, {0: values(5, "a"), 1: values(5, "b")})
    assert producer_pool.kept_producers() == 1  # two tasks, one producer
    too_large = dataclasses.replace(config, sink={**config.sink, "producer_config": {"message.max.bytes": 1000}})
    with pytest.raises(SinkError, match="MSG_SIZE_TOO_LARGE"):
        write_batch(too_large, 2, {0: ["x" * 2000]})
    assert producer_pool.kept_producers() == 1  # the failed task's producer was closed, not kept
    write_batch(config, 3, {0: values(5, "c")})
    assert sorted(read_all(kafka.bootstrap_servers, output)) == sorted(values(5, "a") + values(5, "b") + values(5, "c"))


@pytest.mark.parametrize("ask_brokers", [True, False], ids=["describe-producers", "delivery-reports"])
def test_each_transaction_records_where_it_begins_in_every_partition_it_wrote(kafka, topics, monkeypatch,
                                                                              ask_brokers):
    """The offset that decides "committed or aborted" once the broker forgets a transaction: asked of the
    partitions' leaders (DescribeProducers), or, for a client without READ on the output, taken from a
    delivery report per record. Both must name each transaction's own first record in each partition."""
    name, source, output = topics
    if not ask_brokers:
        monkeypatch.setattr(probe, "may_describe_producers", lambda admin, topic: False)
    config = pipeline(kafka, name, source, output)
    written = write_batch(config, 1, {0: values(20, "a"), 1: values(15, "b")})  # b's begin after a's
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, isolation_level="read_uncommitted",
                             enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        consumer.assign([TopicPartition(output, p) for p in range(2)])
        consumer.seek_to_beginning()
        log = {(r.partition, r.offset): r.value.decode() for r in consumer}
    finally:
        consumer.close()
    assert len(log) == 35
    for report, prefix in zip(written.reports, ("a-", "b-")):
        ours = {}
        for (partition, offset), value in sorted(log.items()):
            if value.startswith(prefix):
                ours.setdefault(partition, offset)
        assert report.first_offsets == tuple((output, p, o) for p, o in sorted(ours.items())), report
    assert written.reports[1].first_offsets != ((output, 0, 0), (output, 1, 0))  # after a's records


def test_commit_after_the_id_was_reused_is_recognised_as_committed(kafka, topics):
    """The adapter's known ambiguity: a retried commit after the transactional id was reused
    raises TransactionLostError although the data is committed. The output decides: no abort."""
    name, source, output = topics
    config = pipeline(kafka, name, source, output)
    sink = bound_sink(config)
    handles = write_batch(config, 4, {0: values(12)})
    sink.commit(fake_batch(config, 4), handles)
    handle = handles.reports[0].transaction
    open_transaction(kafka.bootstrap_servers, handle.transactional_id, 60_000).close()  # bumps the id's epoch
    with pytest.raises(TransactionLostError):  # what the adapter alone would conclude
        commit_transaction(kafka.bootstrap_servers, handle)

    assert "committed 1 Kafka transaction(s)" in sink.commit(fake_batch(config, 4), handles)
    assert_exactly_once(values(12), read_all(kafka.bootstrap_servers, output))


def test_timed_out_transactions_make_the_batch_aborted(kafka, topics, tmp_path):
    name, source, output = topics
    config = pipeline(kafka, name, source, output)
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)))
    ledger, coordinator = pipe.ledger, pipe.coordinator
    batch = pipe.claim(pipe.planted_batch("run-1", [OffsetRange(source, 0, 0, 30)]).id)
    handles = write_batch(config, batch.seq, {0: values(15), 1: values(15, "w")}, timeout_ms=2000)
    coordinator.prepare(batch, handles, 30, 30)
    wait_transactions_ended(kafka.bootstrap_servers, handles)  # notify_complete comes too late

    with pytest.raises(TransactionLostError) as lost:
        coordinator.commit(batch.id)
    assert "aborted before notify_complete committed them" in str(lost.value)
    assert "processed again by the next run" in str(lost.value)
    assert ledger.get_batch(batch.id).state is BatchState.ABORTED
    assert ledger.committed_positions(name) == {}  # offsets did not move: the range is planned again
    assert read_all(kafka.bootstrap_servers, output) == []
    assert len(read_all(kafka.bootstrap_servers, output, "read_uncommitted")) == 30  # it was really written


def test_partly_timed_out_batch_is_aborted_as_a_whole(kafka, topics):
    """One partition's transaction timed out, the other is still open: committing the open one would
    half-commit the batch (and the replay would duplicate it). The sink aborts it instead."""
    name, source, output = topics
    config = pipeline(kafka, name, source, output)
    short = write_batch(config, 2, {0: values(10, "short")}, timeout_ms=2000)
    long = write_batch(config, 2, {1: values(10, "long")}, timeout_ms=120_000)
    wait_transactions_ended(kafka.bootstrap_servers, short)
    handles = KafkaCommittable(short.guarantee, short.bootstrap_servers, short.topic, short.reports + long.reports)

    with pytest.raises(TransactionLostError):
        bound_sink(config).commit(fake_batch(config, 2), handles)
    assert read_all(kafka.bootstrap_servers, output) == []  # settled: the open one was aborted, not left hanging
    assert len(read_all(kafka.bootstrap_servers, output, "read_uncommitted")) == 20


def test_some_transactions_committed_others_timed_out_is_a_partial_commit_left_prepared(kafka, topics, tmp_path):
    """notify_complete committed the first transaction of a batch and died; before its retry the broker timed the
    second one out, and a third (its partition started later, so its timeout ends later) is still open. Nothing
    can make the batch whole: replaying the range would duplicate the committed part, committing the open one
    would not bring back the lost one. The batch stays PREPARED, nothing more of it is committed, every retry
    (notify_complete's, the next run's recovery) fails for good naming the transactions, and read_committed
    consumers see exactly the committed transaction's records."""
    name, source, output = topics
    config = pipeline(kafka, name, source, output, sink={"transaction_timeout_ms": 2000})
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)))
    batch = pipe.claim(pipe.planted_batch("run-1", [OffsetRange(source, 0, 0, 30)]).id)
    # The first is committed in time whatever its timeout (a long one: no race with the writes below). Written
    # in this order, the open transaction's records come after the timed-out one's on every output partition:
    # the read that judges the timed-out one is not held back by the open one.
    first = write_batch(config, batch.seq, {0: values(10, "first")}, timeout_ms=120_000)
    timed_out = write_batch(config, batch.seq, {1: values(10, "late")}, timeout_ms=2000)
    still_open = write_batch(config, batch.seq, {2: values(10, "open")}, timeout_ms=120_000)
    handles = KafkaCommittable(first.guarantee, first.bootstrap_servers, first.topic,
                               first.reports + timed_out.reports + still_open.reports)
    pipe.coordinator.prepare(batch, handles, 30, 30)
    [committed_tid], [lost_tid], [open_tid] = ([r.transactional_id for r in c.reports]
                                               for c in (first, timed_out, still_open))
    commit_transaction(kafka.bootstrap_servers, first.reports[0].transaction)  # notify_complete's first commit...
    wait_transactions_ended(kafka.bootstrap_servers, timed_out)  # ...then it died, and the retry comes too late

    for attempt in (lambda: pipe.commit(batch.id), lambda: pipe.new_coordinator().recover()):
        with pytest.raises(SinkError) as partial:
            attempt()
        assert not isinstance(partial.value, TransactionLostError)  # not lost: the range must not be replayed
        message = str(partial.value)
        assert f"PARTIAL COMMIT of batch {batch.seq}: transactions {committed_tid} are committed but " \
               f"{lost_tid} (10 records) were aborted by the broker" in message
        assert "transaction_timeout_ms=2000" in message and "left PREPARED: decide by hand" in message
        assert open_tid not in message
        assert partial.value.retriable is False  # a retry cannot repair it: the task fails for good
        assert pipe.state(batch.id) is BatchState.PREPARED
        assert pipe.ledger.committed_positions(name) == {}  # the offsets did not move
        assert transaction_state(kafka.bootstrap_servers, open_tid) == "Ongoing"  # not committed, not aborted

    # What read_committed consumers see now (the open transaction holds back what comes after it): the
    # committed part only; and once the operator aborted the open one, still exactly that.
    assert sorted(read_all(kafka.bootstrap_servers, output, settle=False)) == sorted(values(10, "first"))
    abort_transaction(kafka.bootstrap_servers, still_open.reports[0].transaction)  # the operator's decision
    assert_exactly_once(values(10, "first"), read_all(kafka.bootstrap_servers, output))
    assert len(read_all(kafka.bootstrap_servers, output, "read_uncommitted")) == 30


def twelve_partitions(seq: int) -> dict[int, list[str]]:
    """A batch of twelve Spark partitions (the Kafka -> Kafka benchmark's), five records each."""
    return {p: values(5, f"b{seq}p{p}") for p in range(12)}


def test_a_batch_of_twelve_transactions_is_committed_in_one_call_and_again_as_a_no_op(kafka, topics):
    name, source, output = topics
    config = pipeline(kafka, name, source, output)
    sink = bound_sink(config)
    parts = twelve_partitions(3)
    handles = write_batch(config, 3, parts)
    sent = [v for part in parts.values() for v in part]

    assert sink.commit(fake_batch(config, 3), handles) == (
        f"committed 12 Kafka transaction(s) of batch 3 (60 records) to {output!r}")
    assert_exactly_once(sent, read_all(kafka.bootstrap_servers, output))
    assert {settled_transaction_state(kafka.bootstrap_servers, r.transactional_id)
            for r in handles.transactions} == {"CompleteCommit"}
    # notify_complete's retry after a success (and the next run's recovery): nothing changes.
    assert "committed 12 Kafka transaction(s)" in sink.commit(fake_batch(config, 3), handles)
    assert_exactly_once(sent, read_all(kafka.bootstrap_servers, output, "read_uncommitted"))


def test_one_fenced_transaction_of_twelve_makes_the_batch_lost_and_none_is_committed(kafka, topics):
    """A newer attempt of partition 0 fenced its transaction before notify_complete: the batch's output is
    not whole, so none of the twelve is committed, the eleven open ones are aborted, the range replays."""
    name, source, output = topics
    config = pipeline(kafka, name, source, output)
    handles = write_batch(config, 5, twelve_partitions(5))
    fenced = handles.reports[0].transactional_id  # written first: its records come before the others' everywhere
    librdkafka.fence({"bootstrap.servers": kafka.bootstrap_servers}, fenced, 60_000)

    with pytest.raises(TransactionLostError) as lost:
        bound_sink(config).commit(fake_batch(config, 5), handles)
    assert f"({fenced}: timed out after" in str(lost.value) and "never saw their 5 records" in str(lost.value)
    assert read_all(kafka.bootstrap_servers, output) == []  # settled: the open ones were aborted, none committed
    assert len(read_all(kafka.bootstrap_servers, output, "read_uncommitted")) == 60


def test_a_fenced_transaction_after_a_partly_done_commit_is_a_partial_commit_and_commits_nothing_more(kafka, topics):
    """A notify_complete committed two of the twelve and died; then partition 2's transaction was fenced. The
    retry commits none of the nine still open (that would hide the loss) and fails naming both sides."""
    name, source, output = topics
    config = pipeline(kafka, name, source, output)
    sink = bound_sink(config)
    parts = twelve_partitions(6)
    handles = write_batch(config, 6, parts)
    first, second, fenced = (r.transactional_id for r in handles.reports[:3])
    for report in handles.reports[:2]:
        commit_transaction(kafka.bootstrap_servers, report.transaction)
    librdkafka.fence({"bootstrap.servers": kafka.bootstrap_servers}, fenced, 60_000)

    with pytest.raises(SinkError) as partial:
        sink.commit(fake_batch(config, 6), handles)
    assert not isinstance(partial.value, TransactionLostError) and partial.value.retriable is False
    assert (f"PARTIAL COMMIT of batch 6: transactions {first}, {second} are committed but {fenced} (5 records)"
            in str(partial.value))
    assert {transaction_state(kafka.bootstrap_servers, r.transactional_id)
            for r in handles.reports[3:]} == {"Ongoing"}  # not committed, not aborted: decided by hand
    assert sink.abort(fake_batch(config, 6), handles) == "aborted 9 open Kafka transaction(s) of batch 6"
    assert_exactly_once(parts[0] + parts[1], read_all(kafka.bootstrap_servers, output))


def test_a_commit_while_the_brokers_are_unreachable_is_retried_and_names_them(kafka, topics):
    name, source, output = topics
    config = pipeline(kafka, name, source, output, sink={"kafka_config": {"bootstrap.timeout.ms": 1500}})
    handles = write_batch(config, 8, {0: values(3), 1: values(3, "w")})
    unreachable = dataclasses.replace(handles, bootstrap_servers="127.0.0.1:1")

    with pytest.raises(SinkError) as error:
        bound_sink(config).commit(fake_batch(config, 8), unreachable)
    assert error.value.retriable is True
    assert "committing the Kafka transactions of batch 8 failed: no Kafka broker answered at '127.0.0.1:1'" in str(
        error.value)
    assert {transaction_state(kafka.bootstrap_servers, r.transactional_id)
            for r in handles.transactions} == {"Ongoing"}  # untouched: the retry commits them
    bound_sink(config).commit(fake_batch(config, 8), handles)
    assert_exactly_once(values(3) + values(3, "w"), read_all(kafka.bootstrap_servers, output))


def test_abort_ends_the_transactions_a_dead_attempt_left_open(kafka, topics):
    name, source, output = topics
    config = pipeline(kafka, name, source, output)
    sink = bound_sink(config)
    write_batch(config, 7, {0: values(5, "a"), 1: values(5, "b")})  # the attempt that died
    other = write_batch(config, 17, {0: values(5, "c")})  # another batch's open transaction: not ours

    assert sink.abort(fake_batch(config, 7), None) == "aborted 2 open Kafka transaction(s) of batch 7"
    with pytest.raises(AssertionError, match="still has open transactions"):  # batch 17 is left alone
        settled_ends(kafka.bootstrap_servers, output, timeout_s=2)
    sink.commit(fake_batch(config, 17), other)
    assert sorted(read_all(kafka.bootstrap_servers, output)) == values(5, "c")


# --------------------------------------------------------------------------- with Spark


def upper_value(df):
    return df.selectExpr("key", "upper(CAST(value AS STRING)) AS value")


def planned(kafka, name: str, source: str, output: str, tmp_path) -> tuple[Pipe, object]:
    config = pipeline(kafka, name, source, output)
    pipe = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)),
                run_writers=run_partition_writers)
    return pipe, pipe.plan("run-1").batch.id


def test_zombie_write_attempt_is_fenced_and_cannot_commit(kafka, topics, spark, tmp_path):
    from airflow_exactly_once.spark.batch_read import read_batch
    from airflow_exactly_once.spark.write_job import run_write

    name, source, output = topics
    sent = produce(kafka.bootstrap_servers, source, 60)
    pipe, batch_id = planned(kafka, name, source, output, tmp_path)
    coordinator = pipe.coordinator

    # Attempt A claims the batch, pre-commits its transactions, then stalls (GC pause, lost worker)...
    zombie = pipe.claim(batch_id)
    zombie_handles = pipe.stage(upper_value(read_batch(spark, zombie, coordinator.config).frame), zombie)
    # ...so Airflow retries the write: attempt B re-opens the same transactional ids, which fences A.
    assert run_write(spark, coordinator, batch_id, transform=upper_value)["action"] == "prepared"

    # A wakes up: the ledger refuses its PREPARED, and the broker refuses its transactions.
    with pytest.raises(FencedError):
        coordinator.prepare(zombie, zombie_handles, 60, 60)
    for report in zombie_handles.transactions:
        with pytest.raises(TransactionLostError):
            commit_transaction(kafka.bootstrap_servers, report.transaction)
    assert coordinator.ledger.get_batch(batch_id).state is BatchState.PREPARED

    assert "COMMITTED" in coordinator.commit(batch_id)
    assert_exactly_once([v.upper() for v in sent], read_all(kafka.bootstrap_servers, output))
    assert len(read_all(kafka.bootstrap_servers, output, "read_uncommitted")) == 120  # A's copy, aborted


def test_output_without_a_value_column_fails_clearly_and_writes_nothing(kafka, topics, spark, tmp_path):
    from airflow_exactly_once.spark.write_job import run_write

    name, source, output = topics
    produce(kafka.bootstrap_servers, source, 30)
    pipe, batch_id = planned(kafka, name, source, output, tmp_path)
    coordinator = pipe.coordinator

    def wrong_columns(df):
        return df.selectExpr("CAST(value AS STRING) AS payload")

    def struct_value(df):
        return df.selectExpr("struct(key, value) AS value")

    with pytest.raises(TransformError, match="needs a 'value' column .* returned columns payload"):
        run_write(spark, coordinator, batch_id, transform=wrong_columns)
    with pytest.raises(TransformError, match="returned it as struct<key:binary,value:binary>; return STRING or "
                                             "BINARY"):
        run_write(spark, coordinator, batch_id, transform=struct_value)
    assert coordinator.ledger.get_batch(batch_id).state is BatchState.PLANNED
    assert "ABORTED" in coordinator.abort(batch_id, "the transform is wrong")
    assert coordinator.ledger.get_batch(batch_id).state is BatchState.ABORTED
    assert set(settled_ends(kafka.bootstrap_servers, output).values()) == {0}  # not even aborted records
    assert coordinator.ledger.list_batches(name, [BatchState.PREPARED, BatchState.COMMITTED]) == []


def test_many_partitions_are_written_a_transaction_per_core_and_a_crashed_attempt_is_fenced(kafka, spark, tmp_path,
                                                                                         faults, monkeypatch):
    """Six input partitions on local[2] are read and written by two tasks (spark.batch_read.read_layout). An attempt
    that dies after staging leaves its two transactions open; the retry has the same two transactional ids, so
    initialising them fences and aborts the dead attempt's, and each record is visible once."""
    from airflow_exactly_once.core.faults import ENV, InjectedFault, arm
    from airflow_exactly_once.spark.batch_read import ReadLayout, read_layout
    from airflow_exactly_once.spark.write_job import run_write

    name = f"ks-{uuid.uuid4().hex[:8]}"
    source, output = f"{name}-in", f"{name}-out"
    create_topic(kafka.bootstrap_servers, source, partitions=6)
    create_topic(kafka.bootstrap_servers, output, partitions=2)
    sent = produce(kafka.bootstrap_servers, source, 120, partitions=6)
    pipe, batch_id = planned(kafka, name, source, output, tmp_path)
    coordinator = pipe.coordinator
    assert read_layout(spark, coordinator.ledger.get_batch(batch_id), create_writer(coordinator.config.sink)) == ReadLayout(tasks=2)

    monkeypatch.setenv(ENV, str(faults))
    arm(faults, "write.after_stage", "raise", times=1)  # staged, never PREPARED: what a killed write leaves
    with pytest.raises(InjectedFault):
        run_write(spark, coordinator, batch_id, transform=upper_value)
    assert run_write(spark, coordinator, batch_id, transform=upper_value)["output_records"] == 120

    batch = coordinator.ledger.get_batch(batch_id)
    assert sorted(w["partition"] for w in batch.handles["writers"]) == [0, 1]  # two transactions, not six
    assert "COMMITTED" in coordinator.commit(batch_id)
    assert_exactly_once([v.upper() for v in sent], read_all(kafka.bootstrap_servers, output))
    assert len(read_all(kafka.bootstrap_servers, output, "read_uncommitted")) == 240  # the dead attempt's, aborted
