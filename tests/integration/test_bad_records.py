"""Bad records with real Kafka, real Spark and each real sink (issue 12, invariant 8).

The input topic holds good JSON records and four bad ones: a truncated value, a field of the
wrong type, a tombstone (null value) and a poison record the transform cannot compute
(its guarded UDF raises). Each policy is driven through spark.write_job.run_write and the
coordinator, as the write and notify_complete tasks do:

* fail: the batch fails naming the bad records' offsets; nothing is staged, the batch stays PLANNED;
* skip: the good records are written, the bad ones counted in the ledger and in an event;
* dead_letter: output + dead letters hold every input offset exactly once, both invisible
  until notify_complete commits them;
* max_bad_records fails the batch whatever the policy.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from kafka import KafkaProducer

from airflow_exactly_once.core.errors import BadRecordsError, TransactionLostError
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.spark.partition_writers import run_partition_writers
from airflow_exactly_once.spark.records import guarded_column
from airflow_exactly_once.spark.write_job import run_write
from tests.conftest import PG_DATABASE
from tests.harness import Pipe, open_ledger, pipeline_config
from tests.helpers import create_topic, pg_query, read_parquet, staging_leftovers
from tests.kafka_helpers import (
    read_all,
    settled_ends,
    settled_transaction_state,
    transaction_state,
    wait_transactions_ended,
)

GOOD = 40
SCHEMA = "id BIGINT, amount BIGINT"
BAD = {  # value -> why it is bad
    b'{"id": 100, "amount"': "not JSON matching value_schema",
    b'{"id": "abc", "amount": 3}': "not JSON matching value_schema",
    None: "a null value (a tombstone)",
    b'{"id": 200, "amount": 0}': "ZeroDivisionError",
}


def share(df):
    """The transform: 1000 // amount, where amount 0 raises for that record only."""
    df = guarded_column(df, "share", lambda amount: 1000 // amount, "long", "amount")
    return df.select("id", "share", "_source", "_bad_record")


def share_as_kafka_value(df):
    return share(df).selectExpr("CAST(id AS STRING) AS key", "to_json(named_struct('id', id, 'share', share)) AS value",
                                "_source", "_bad_record")


@pytest.fixture
def source(kafka) -> tuple[str, dict[tuple[int, int], bytes | None]]:
    """A two-partition topic with GOOD good records and the four bad ones; {(partition, offset): value}."""
    topic = f"bad-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap_servers, topic, partitions=2)
    values = [json.dumps({"id": i, "amount": i + 1}).encode() for i in range(GOOD)]
    values[7:7] = [list(BAD)[0]]
    values[21:21] = list(BAD)[1:3]
    values.append(list(BAD)[3])
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    futures = [producer.send(topic, key=str(n).encode(), value=v, partition=n % 2) for n, v in enumerate(values)]
    producer.flush()
    producer.close()
    sent = {}
    for future, value in zip(futures, values):
        meta = future.get(timeout=30)
        sent[(meta.partition, meta.offset)] = value
    return topic, sent


def pipe(kafka, tmp_path: Path, topic: str, sink: dict, **settings) -> Pipe:
    config = pipeline_config(f"{topic}-p", [topic], sink, bootstrap=kafka.bootstrap_servers, value_format="json",
                             value_schema=SCHEMA, **settings)
    made = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)),
                run_writers=run_partition_writers)
    made.sink.check(config.pipeline_id)
    return made


def bad_offsets(sent) -> dict[tuple[int, int], str]:
    return {where: BAD[value] for where, value in sent.items() if value in BAD}


def test_fail_names_the_bad_records_and_stages_nothing(kafka, spark, tmp_path, source):
    topic, sent = source
    out = tmp_path / "out"
    p = pipe(kafka, tmp_path, topic, {"type": "parquet", "path": str(out)})
    batch_id = p.plan("run-1").batch.id
    with pytest.raises(BadRecordsError) as caught:
        run_write(spark, p.coordinator, batch_id, transform=share)
    text = str(caught.value)
    assert f"4 of {GOOD + 4} records of batch {batch_id} are bad" in text
    assert "3 could not be decoded as json, 1 marked bad by the transform" in text
    for (partition, offset), why in bad_offsets(sent).items():
        assert f"{topic}[{partition}] offset {offset}: {why}" in text
    assert caught.value.retriable is False
    assert p.state(batch_id) is BatchState.PLANNED
    assert read_parquet(out) == [] and staging_leftovers(out) == []


def test_skip_writes_the_good_records_and_records_the_bad(kafka, spark, tmp_path, source):
    topic, sent = source
    out = tmp_path / "out"
    p = pipe(kafka, tmp_path, topic, {"type": "parquet", "path": str(out)}, bad_record_policy="skip")
    batch_id = p.plan("run-1").batch.id
    summary = run_write(spark, p.coordinator, batch_id, transform=share)
    assert (summary["input_records"], summary["output_records"], summary["bad_records"]) == (GOOD + 4, GOOD, 4)
    details = p.ledger.get_batch(batch_id).details["bad_records"]
    assert (details["count"], details["undecodable"], details["marked_by_transform"]) == (4, 3, 1)
    assert {(r["partition"], r["offset"]) for r in details["first"]} == set(bad_offsets(sent))
    p.commit(batch_id)
    assert sorted((r["id"], r["share"]) for r in read_parquet(out)) == [(i, 1000 // (i + 1)) for i in range(GOOD)]
    events = [e for e in p.ledger.list_events(p.config.pipeline_id) if e["kind"] == "bad-records-skipped"]
    assert len(events) == 1 and "4 bad record(s) skipped" in events[0]["message"]
    p.commit(batch_id)  # again: no second event
    assert len([e for e in p.ledger.list_events(p.config.pipeline_id) if e["kind"] == "bad-records-skipped"]) == 1


def test_max_bad_records_fails_the_batch_whatever_the_policy(kafka, spark, tmp_path, source):
    topic, _ = source
    out = tmp_path / "out"
    p = pipe(kafka, tmp_path, topic, {"type": "parquet", "path": str(out)}, bad_record_policy="dead_letter",
             max_bad_records=0.05)
    batch_id = p.plan("run-1").batch.id
    with pytest.raises(BadRecordsError, match="more than max_bad_records=0.05"):
        run_write(spark, p.coordinator, batch_id, transform=share)
    assert p.state(batch_id) is BatchState.PLANNED
    assert staging_leftovers(out) == [] and not (out / "_dead_letter" / "_staging").exists()


class ParquetOutput:
    transform = staticmethod(share)

    def __init__(self, request, tmp_path: Path, topic: str) -> None:
        self.root = tmp_path / "out"
        self.spec, self.dead_letter = {"type": "parquet", "path": str(self.root)}, None

    def output(self) -> list[int]:
        return [r["id"] for r in read_parquet(self.root)]

    def dead_letters(self) -> list[dict]:
        return read_parquet(self.root / "_dead_letter")


class KafkaOutput:
    transform = staticmethod(share_as_kafka_value)

    def __init__(self, request, tmp_path: Path, topic: str) -> None:
        self.bootstrap = request.getfixturevalue("kafka").bootstrap_servers
        self.topic, self.dlq = f"{topic}-out", f"{topic}-dlq"
        create_topic(self.bootstrap, self.topic, partitions=2)
        create_topic(self.bootstrap, self.dlq, partitions=1)
        self.spec = {"type": "kafka", "topic": self.topic}
        self.dead_letter = {"type": "kafka", "topic": self.dlq}

    def output(self) -> list[int]:
        return [json.loads(v)["id"] for v in read_all(self.bootstrap, self.topic, settle=False)]

    def dead_letters(self) -> list[dict]:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, isolation_level="read_committed",
                                 enable_auto_commit=False, consumer_timeout_ms=3000)
        consumer.assign([TopicPartition(self.dlq, 0)])
        consumer.seek_to_beginning()
        records = []
        for message in consumer:
            headers = {k: v.decode() for k, v in message.headers}
            records.append({"source_partition": int(headers["aeo.source_partition"]),
                            "source_offset": int(headers["aeo.source_offset"]), "error": headers["aeo.error"],
                            "value": message.value, "source_topic": headers["aeo.source_topic"]})
        consumer.close()
        return records


class PostgresOutput:
    transform = staticmethod(share)

    def __init__(self, request, tmp_path: Path, topic: str) -> None:
        self.dsn = request.getfixturevalue("postgres").dsn(PG_DATABASE)
        self.table = topic.replace("-", "_")
        pg_query(self.dsn, f"CREATE TABLE {self.table} (id bigint PRIMARY KEY, share bigint)")
        self.spec, self.dead_letter = {"type": "postgres", "url": self.dsn, "table": self.table}, None

    def output(self) -> list[int]:
        return [r[0] for r in pg_query(self.dsn, f"SELECT id FROM {self.table}")]

    def dead_letters(self) -> list[dict]:
        exists = pg_query(self.dsn, "SELECT to_regclass(%s) IS NOT NULL", (f"{self.table}_dead_letter",))[0][0]
        if not exists:
            return []
        rows = pg_query(self.dsn, f"SELECT source_topic, source_partition, source_offset, error, value "
                                  f"FROM {self.table}_dead_letter")
        return [{"source_topic": t, "source_partition": p, "source_offset": o, "error": e,
                 "value": None if v is None else bytes(v)} for t, p, o, e, v in rows]


class IcebergOutput:
    """An Iceberg table (embedded catalog); it has no default destination, so the dead letters go to a
    PostgreSQL table named here, committed with the table's snapshot."""
    transform = staticmethod(share)

    def __init__(self, request, tmp_path: Path, topic: str) -> None:
        # a catalog name of its own: one Spark session keeps each catalog it loaded, with its first warehouse
        self.spec = {"type": "iceberg", "table": f"db.{topic.replace('-', '_')}", "warehouse": str(tmp_path / "lake"),
                     "catalog": {"name": f"c{topic[-8:]}"}, "create_table": True}
        self.letters = PostgresOutput(request, tmp_path, topic)
        self.dead_letter = {"type": "postgres", "url": self.letters.dsn, "table": f"{self.letters.table}_dead_letter"}

    def output(self) -> list[int]:
        from airflow_exactly_once.sinks import create_committer

        table = create_committer(self.spec).target.table_committer.load()
        return table.scan().to_arrow().column("id").to_pylist() if table.current_snapshot() else []

    def dead_letters(self) -> list[dict]:
        return self.letters.dead_letters()


OUTPUTS = {"parquet": ParquetOutput, "kafka": KafkaOutput, "postgres": PostgresOutput, "iceberg": IcebergOutput}


@pytest.mark.parametrize("kind", sorted(OUTPUTS))
def test_dead_letters_commit_with_the_output_and_every_record_lands_once(kafka, spark, tmp_path, source, request,
                                                                         kind):
    topic, sent = source
    target = OUTPUTS[kind](request, tmp_path, topic)
    extra = {"dead_letter": target.dead_letter} if target.dead_letter else {}
    p = pipe(kafka, tmp_path, topic, target.spec, bad_record_policy="dead_letter", **extra)
    batch_id = p.plan("run-1").batch.id
    summary = run_write(spark, p.coordinator, batch_id, transform=target.transform)
    assert (summary["output_records"], summary["bad_records"]) == (GOOD, 4)
    assert target.output() == [] and target.dead_letters() == []  # pre-committed: nothing visible

    p.new_coordinator().commit(batch_id)  # notify_complete, another process
    p.new_coordinator().commit(batch_id)  # run again: idempotent
    assert sorted(target.output()) == list(range(GOOD))
    letters = target.dead_letters()
    assert {(d["source_partition"], d["source_offset"]): d["value"] for d in letters} == {
        where: value for where, value in sent.items() if value in BAD}
    errors = {(d["source_partition"], d["source_offset"]): d["error"] for d in letters}
    for where, why in bad_offsets(sent).items():
        assert why in errors[where]
    assert {d["source_topic"] for d in letters} == {topic}
    assert len(letters) + len(target.output()) == len(sent)  # every input record exactly once
    assert p.state(batch_id) is BatchState.COMMITTED


AVRO_SCHEMA = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]})


def test_avro_values_decode_and_truncated_ones_are_dead_letters(kafka, spark, tmp_path):
    """value_format='avro': spark-avro decodes with value_schema; a truncated record is a bad record, not nulls."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    # What a producer with this schema sends: each record's Avro binary encoding.
    rows = spark.createDataFrame([(i, f"item-{i}") for i in range(20)], "id LONG, name STRING").orderBy("id")
    values = [bytes(r["v"]) for r in rows.select(to_avro(F.struct("id", "name"), AVRO_SCHEMA).alias("v")).collect()]
    truncated = values[5][:-2]  # the name's length says 6 bytes, 4 follow
    topic = f"avro-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap_servers, topic, partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    for value in values + [truncated]:
        producer.send(topic, value=value, partition=0)
    producer.flush()
    producer.close()
    out = tmp_path / "out"
    config = pipeline_config(f"{topic}-p", [topic], {"type": "parquet", "path": str(out)},
                             bootstrap=kafka.bootstrap_servers, value_format="avro", value_schema=AVRO_SCHEMA,
                             bad_record_policy="dead_letter")
    p = Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)),
             run_writers=run_partition_writers)
    batch_id = p.plan("run-1").batch.id
    summary = run_write(spark, p.coordinator, batch_id, transform=lambda df: df.select("id", "name"))
    assert (summary["input_records"], summary["output_records"], summary["bad_records"]) == (21, 20, 1)
    p.commit(batch_id)
    assert sorted((r["id"], r["name"]) for r in read_parquet(out)) == [(i, f"item-{i}") for i in range(20)]
    [letter] = read_parquet(out / "_dead_letter")
    assert (letter["source_offset"], letter["value"]) == (20, truncated)
    assert "not an Avro record of value_schema" in letter["error"]


def test_an_avro_record_of_nulls_is_good_only_when_encoded_as_one(spark):
    """from_avro gives a record of nulls for garbage too: the end mark tells the real all-null record from it."""
    from airflow_exactly_once.spark import records

    schema = json.dumps({"type": "record", "name": "R", "fields": [
        {"name": "a", "type": ["null", "string"]}, {"name": "b", "type": ["null", "long"]}]})
    config = pipeline_config("nulls", ["t"], {"type": "parquet", "path": "/tmp/unused"}, value_format="avro",
                             value_schema=schema)
    frame = spark.createDataFrame([(b"\x00\x00",), (b"\x02\x02x\x02\x04",), (b"\xff\xff",)], "value BINARY")
    got = [(r["a"], r["b"], r[records.DECODE_ERROR]) for r in records.decode(frame, config).collect()]
    assert got[:2] == [(None, None, None), ("x", 2, None)]
    assert got[2][:2] == (None, None) and "not an Avro record" in got[2][2]


def test_content_after_a_json_value_or_an_avro_record_makes_it_bad(spark):
    """Issue 31: Spark's readers stop after the first JSON value or Avro record; what follows is not ignored here."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    from airflow_exactly_once.spark import records

    config = pipeline_config("strict", ["t"], {"type": "parquet", "path": "/tmp/unused"}, value_format="json",
                             value_schema=SCHEMA)
    texts = ['{"id": 1, "amount": 2}', ' {"id": 2, "amount": 3}\n', '{"id": 3, "amount": 4} garbage',
             '{"id": 4, "amount": 5} {"id": 5, "amount": 6}', '{"id": 6, "amount": 7}] x [', '{"id": 7, "amount": 8}}]',
             '{"id": 8, "amount": 9}, {"id": 9, "amount": 10}', '{"id": 10, "amount": 11, "note": "}] {"}']
    frame = spark.createDataFrame([(t.encode(),) for t in texts], "value BINARY")
    errors = [r[records.DECODE_ERROR] for r in records.decode(frame, config).collect()]
    assert [e is None for e in errors] == [True, True, False, False, False, False, False, True], errors
    assert "content follows the value" in errors[2]

    avro = json.dumps({"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"},
                                                                   {"name": "name", "type": "string"}]})
    config = pipeline_config("strict-avro", ["t"], {"type": "parquet", "path": "/tmp/unused"}, value_format="avro",
                             value_schema=avro)
    [good] = [bytes(r[0]) for r in spark.createDataFrame([(1, "one")], "id LONG, name STRING")
              .select(to_avro(F.struct("id", "name"), avro)).collect()]
    frame = spark.createDataFrame([(good,), (good + b"\x00",), (good + good,)], "value BINARY")
    errors = [r[records.DECODE_ERROR] for r in records.decode(frame, config).collect()]
    assert errors[0] is None and "bytes following the record" in errors[1] and "bytes following the record" in errors[2]


def test_a_lost_output_releases_its_dead_letters_at_once(kafka, spark, tmp_path, source, request):
    """Issue 31: the output's transactions expire before notify_complete while the dead letters' (a longer
    timeout) are still open. The batch becomes ABORTED only after its dead-letter transactions were aborted
    too: nothing of it holds the dead-letter topic's last stable offset, and the next batch's output and dead
    letters are visible to read_committed consumers at once."""
    topic, sent = source
    target = KafkaOutput(request, tmp_path, topic)
    p = pipe(kafka, tmp_path, topic, {**target.spec, "transaction_timeout_ms": 6000},
             bad_record_policy="dead_letter", dead_letter=target.dead_letter)
    first = p.plan("run-1").batch.id
    run_write(spark, p.coordinator, first, transform=target.transform)
    staged = p.sink.committable(p.ledger.get_batch(first).handles)
    wait_transactions_ended(kafka.bootstrap_servers, staged.output)  # notify_complete comes too late
    assert {transaction_state(kafka.bootstrap_servers, r.transactional_id)
            for r in staged.dead_letters.transactions} == {"Ongoing"}

    with pytest.raises(TransactionLostError):
        p.new_coordinator().commit(first)
    assert p.state(first) is BatchState.ABORTED
    assert {settled_transaction_state(kafka.bootstrap_servers, r.transactional_id)
            for r in staged.dead_letters.transactions} == {"CompleteAbort"}
    settled_ends(kafka.bootstrap_servers, target.dlq, timeout_s=1)  # no open transaction holds it

    second = p.plan("run-2").batch
    run_write(spark, p.coordinator, second.id, transform=target.transform)
    p.new_coordinator().commit(second.id)
    assert sorted(target.output()) == list(range(GOOD))  # read_committed, at once
    letters = target.dead_letters()
    assert sorted((d["source_partition"], d["source_offset"]) for d in letters) == sorted(bad_offsets(sent))


def test_a_lost_postgres_output_rolls_back_its_prepared_dead_letters(kafka, spark, tmp_path, source, request):
    """The same with PostgreSQL: the output's prepared transactions are gone (rolled back by hand, as after a
    DBA's cleanup); notify_complete finds the batch lost and rolls back its prepared dead letters before the
    batch is ABORTED, so no prepared transaction of it holds the dead-letter table's locks."""
    topic, sent = source
    target = PostgresOutput(request, tmp_path, topic)
    p = pipe(kafka, tmp_path, topic, target.spec, bad_record_policy="dead_letter")
    first = p.plan("run-1").batch.id
    run_write(spark, p.coordinator, first, transform=target.transform)
    staged = p.sink.committable(p.ledger.get_batch(first).handles)
    for gid in staged.output.gids:
        pg_query(target.dsn, f"ROLLBACK PREPARED '{gid}'")

    with pytest.raises(TransactionLostError):
        p.new_coordinator().commit(first)
    assert p.state(first) is BatchState.ABORTED
    prepared = {r[0] for r in pg_query(target.dsn, "SELECT gid FROM pg_prepared_xacts")}
    assert staged.dead_letters.gids and not prepared & set(staged.dead_letters.gids)

    second = p.plan("run-2").batch
    run_write(spark, p.coordinator, second.id, transform=target.transform)
    p.new_coordinator().commit(second.id)
    assert sorted(target.output()) == list(range(GOOD))
    assert len(target.dead_letters()) == len(bad_offsets(sent))


def test_a_transform_that_runs_its_own_action_still_gets_every_bad_record_counted(kafka, spark, tmp_path, source):
    """The single pass counts bad records with an Observation, which keeps the metrics of the first action only:
    a transform that looks at one row first must not make the batch's bad records invisible."""
    topic, sent = source
    out = tmp_path / "out"
    p = pipe(kafka, tmp_path, topic, {"type": "parquet", "path": str(out)})

    def peeks_first(df):
        df.limit(1).collect()  # an action on part of the batch, before the write's own
        return df.select("id", "amount")

    batch_id = p.plan("run-1").batch.id
    with pytest.raises(BadRecordsError) as caught:
        run_write(spark, p.coordinator, batch_id, transform=peeks_first)
    assert f"3 of {GOOD + 4} records of batch {batch_id} are bad" in str(caught.value)
    assert p.state(batch_id) is BatchState.PLANNED
    assert read_parquet(out) == [] and staging_leftovers(out) == []


def test_the_one_pass_write_stops_at_a_bad_record_below_the_transforms_own_filter(kafka, spark, tmp_path, source,
                                                                                 request):
    """The one-pass write fails its Spark task at the first undecodable record and the batch takes the policy
    path. A transform that filters on decoded fields (null in a bad record) must not hide them from that
    check: every bad record is a dead letter, and the output's transactions of the stopped write are aborted
    (the topic's last stable offset is not held back)."""
    topic, sent = source
    target = KafkaOutput(request, tmp_path, topic)
    p = pipe(kafka, tmp_path, topic, target.spec, bad_record_policy="dead_letter", dead_letter=target.dead_letter)

    def large_amounts(df):  # no marks: the poison record (amount 0) is a good one here, and filtered out
        return df.filter("amount > 5").selectExpr("CAST(id AS STRING) AS key", "to_json(named_struct('id', id)) AS value")

    batch_id = p.plan("run-1").batch.id
    summary = run_write(spark, p.coordinator, batch_id, transform=large_amounts)
    undecodable = {where: why for where, why in bad_offsets(sent).items() if why != "ZeroDivisionError"}
    assert (summary["input_records"], summary["output_records"], summary["bad_records"]) == (
        len(sent), GOOD - 5, len(undecodable))
    p.new_coordinator().commit(batch_id)
    settled_ends(kafka.bootstrap_servers, target.topic, timeout_s=1)  # no open transaction holds the output
    assert sorted(target.output()) == list(range(5, GOOD))
    letters = target.dead_letters()
    assert {(d["source_partition"], d["source_offset"]): d["error"] for d in letters}.keys() == undecodable.keys()
    for letter in letters:
        assert undecodable[(letter["source_partition"], letter["source_offset"])] in letter["error"]


@pytest.mark.parametrize("kind", ["postgres", "iceberg"])
def test_a_one_pass_write_stopped_by_a_bad_record_leaves_nothing_and_the_retry_commits_once(kafka, spark, tmp_path,
                                                                                           source, request, kind):
    """The sinks whose failed stage cleans itself (PostgreSQL rolls back, Iceberg drops the snapshot): the one-pass
    write stops at the first undecodable record, and the policy path stages the batch again in the same attempt;
    its output and dead letters are each committed once."""
    topic, sent = source
    target = OUTPUTS[kind](request, tmp_path, topic)
    p = pipe(kafka, tmp_path, topic, target.spec, bad_record_policy="dead_letter", dead_letter=target.dead_letter)
    batch_id = p.plan("run-1").batch.id
    summary = run_write(spark, p.coordinator, batch_id, transform=lambda df: df.selectExpr("id", "amount AS share"))
    assert (summary["output_records"], summary["bad_records"]) == (GOOD + 1, 3)  # the poison record decodes
    assert target.output() == [] and target.dead_letters() == []
    p.new_coordinator().commit(batch_id)
    assert sorted(target.output()) == [*range(GOOD), 200]
    letters = target.dead_letters()
    undecodable = {where for where, why in bad_offsets(sent).items() if why != "ZeroDivisionError"}
    assert sorted((d["source_partition"], d["source_offset"]) for d in letters) == sorted(undecodable)
