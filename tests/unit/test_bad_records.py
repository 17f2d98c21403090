"""Bad-record rules without Spark: settings, the policy decision, the dead-letter destination, and the
output + dead-letter pair keeping the two-phase commit whole (records.bad_records, sinks.dead_letters)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_exactly_once.core.errors import BadRecordsError, ConfigurationError, TransactionLostError
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.records.bad_records import BadRecordCounts, check_counts
from airflow_exactly_once.sinks import dead_letter_spec, pipeline_committer, pipeline_writer
from airflow_exactly_once.sinks.dead_letters import PairedCommitter, PairedWriter
from tests.harness import FakeSource, MarkerWriter, Pipe, open_ledger, pipeline_config


def config(tmp_path: Path, **overrides):
    return pipeline_config("orders", ["t"], {"type": "parquet", "path": str(tmp_path / "out")}, **overrides)


@pytest.mark.parametrize("overrides, message", [
    ({"value_format": "xml"}, "value_format='xml' is not supported"),
    ({"value_format": "json"}, "needs value_schema"),
    ({"value_format": "avro"}, "needs value_schema"),
    ({"value_schema": "id INT"}, "only used with value_format json, avro, protobuf or json_schema"),
    ({"value_format": "protobuf"}, "give schema_registry_conn_id"),
    ({"key_format": "json_schema"}, "key_format='json_schema' reads the Schema Registry wire format"),
    ({"key_format": "xml"}, "key_format='xml' is not supported"),
    ({"key_schema": "\"string\""}, "key_schema is only used with key_format"),
    ({"value_subject": "orders-value"}, "value_subject is only used with value_format"),
    ({"value_format": "avro", "schema_registry_conn_id": "sr", "value_schema": 2.5}, "give a version number"),
    ({"bad_record_policy": "ignore"}, "bad_record_policy='ignore' is not supported"),
    ({"dead_letter": {"type": "kafka", "topic": "dlq"}}, "only used with bad_record_policy='dead_letter'"),
    ({"bad_record_policy": "dead_letter", "dead_letter": "dlq"}, "must be a sink spec"),
    ({"max_bad_records": -1}, "max_bad_records=-1"),
    ({"max_bad_records": 1.5}, "a fraction"),
    ({"max_bad_records": True}, "max_bad_records=True"),
])
def test_bad_settings_are_refused_with_the_fix(tmp_path, overrides, message):
    with pytest.raises(ConfigurationError, match=message):
        config(tmp_path, **overrides)


def test_decoding_changes_the_fingerprint_only_when_set(tmp_path):
    plain = config(tmp_path)
    assert config(tmp_path, bad_record_policy="skip").fingerprint() == plain.fingerprint()
    decoded = config(tmp_path, value_format="json", value_schema="id INT")
    assert decoded.fingerprint() != plain.fingerprint()
    assert config(tmp_path, value_format="json", value_schema="id BIGINT").fingerprint() != decoded.fingerprint()


def counts(bad: int = 0, marked: int = 0, records: int = 100) -> BadRecordCounts:
    first = [{"topic": "t", "partition": 0, "offset": 7, "error": "not JSON", "value": b'{"id": 1' + b"x" * 200}]
    return BadRecordCounts(records, undecodable=bad, marked_by_transform=marked, first=first if bad or marked else [])


def test_fail_names_the_first_bad_records_and_the_choices(tmp_path):
    check_counts(config(tmp_path), counts(), "orders/1")  # no bad record: nothing to decide
    with pytest.raises(BadRecordsError) as caught:
        check_counts(config(tmp_path, value_format="json", value_schema="id INT"), counts(bad=2, marked=1), "orders/1")
    text = str(caught.value)
    assert "3 of 100 records of batch orders/1 are bad" in text and "t[0] offset 7: not JSON" in text
    assert "could not be decoded as json" in text and "1 marked bad by the transform" in text
    assert "..." in text and "x" * 81 not in text  # the value is cut
    assert "bad_record_policy='dead_letter'" in text and "'skip'" in text
    assert caught.value.retriable is False


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_max_bad_records_trips_whatever_the_policy(tmp_path, policy):
    for limit, bad, trips in ((5, 5, False), (5, 6, True), (0.05, 5, False), (0.05, 6, True), (0, 1, True)):
        settings = config(tmp_path, bad_record_policy=policy, max_bad_records=limit)
        if trips:
            with pytest.raises(BadRecordsError, match=f"more than max_bad_records={limit!r}"):
                check_counts(settings, counts(bad=bad), "orders/1")
        else:
            check_counts(settings, counts(bad=bad), "orders/1")


def test_ledger_details_keep_counts_and_where_not_values():
    details = counts(bad=2, marked=1).details("skip")
    assert details == {"bad_records": {"count": 3, "undecodable": 2, "marked_by_transform": 1, "policy": "skip",
                                       "first": [{"topic": "t", "partition": 0, "offset": 7, "error": "not JSON"}]}}


def test_dead_letter_destination_defaults_beside_the_output(tmp_path):
    parquet = dead_letter_spec(config(tmp_path, bad_record_policy="dead_letter"))
    assert parquet == {"type": "parquet", "path": f"{tmp_path}/out/_dead_letter"}
    pg = dead_letter_spec(pipeline_config("orders", ["t"], {"type": "postgres", "conn_id": "pg", "table": "s.orders",
                                                            "mode": "upsert"}, bad_record_policy="dead_letter"))
    assert pg["table"] == "s.orders_dead_letter" and pg["conn_id"] == "pg" and "mode" not in pg
    assert pg["transaction_name"] == "orders~dead-letter" and "error" in pg["create_columns"]
    kafka_sink = {"type": "kafka", "topic": "out", "guarantee": "AT_LEAST_ONCE"}
    with pytest.raises(ConfigurationError, match="needs a dead-letter topic"):
        dead_letter_spec(pipeline_config("orders", ["t"], kafka_sink, bad_record_policy="dead_letter"))
    given = dead_letter_spec(pipeline_config("orders", ["t"], kafka_sink, bad_record_policy="dead_letter",
                                             dead_letter={"type": "kafka", "topic": "dlq"}))
    assert given["transactional_id_prefix"] == "orders~dead-letter" and given["guarantee"] == "AT_LEAST_ONCE"


def test_only_the_dead_letter_policy_pairs_sinks(tmp_path):
    skipping = config(tmp_path, bad_record_policy="skip")
    assert not isinstance(pipeline_committer(skipping), PairedCommitter)
    assert not isinstance(pipeline_writer(skipping), PairedWriter)
    paired = pipeline_committer(config(tmp_path, bad_record_policy="dead_letter"))
    assert isinstance(paired, PairedCommitter) and paired.dead.layout.root == tmp_path / "out" / "_dead_letter"
    assert isinstance(pipeline_writer(config(tmp_path, bad_record_policy="dead_letter")), PairedWriter)
    with pytest.raises(ValueError, match="no dead-letter destination"):
        pipeline_writer(config(tmp_path)).stage_batch(None, object(), None, None)


def paired_pipe(tmp_path: Path) -> Pipe:
    settings = config(tmp_path, bad_record_policy="dead_letter")
    ledger = open_ledger(tmp_path / "ledger.db")
    return Pipe(settings, ledger, lambda: FakeSource({("t", 0): 10}), writer_factory=lambda c: PairedWriter(
        MarkerWriter(c.sink), MarkerWriter(dead_letter_spec(c))))


def write_with_dead_letters(pipe: Pipe, bad: object | None = "bad rows"):
    batch_id = pipe.plan("run-1").batch.id
    claimed = pipe.claim(batch_id)
    staged = pipe.writer.stage_batch("good rows", bad, claimed, pipe.run_writers)
    pipe.coordinator.prepare(claimed, staged, 10, 9)
    return batch_id, staged


def test_output_and_dead_letters_commit_together_and_recover_from_the_ledger(tmp_path):
    pipe = paired_pipe(tmp_path)
    batch_id, staged = write_with_dead_letters(pipe)
    stored = pipe.ledger.get_batch(batch_id).handles
    assert stored["staging"] == staged.output.staging and stored["dead_letter"]["staging"] == staged.dead_letters.staging
    # The output's own handles at the top, the dead letters' nested (ledgers in the field hold this layout) ...
    assert stored == {**staged.output.to_handles(), "dead_letter": staged.dead_letters.to_handles(), "records": 9}
    # ... and the pair reads itself back from them, through its committer or its own type alike.
    assert pipe.new_coordinator().sink.committable(stored) == staged == type(staged).from_handles(stored)
    out, dead = tmp_path / "out" / "batch_seq=1", tmp_path / "out" / "_dead_letter" / "batch_seq=1"
    assert not out.exists() and not dead.exists()  # pre-committed: nothing visible
    pipe.new_coordinator().commit(batch_id)  # another process: the pair is rebuilt from the handles
    assert out.is_dir() and dead.is_dir() and pipe.state(batch_id) is BatchState.COMMITTED
    pipe.new_coordinator().commit(batch_id)  # idempotent


def test_a_batch_without_bad_records_stages_no_dead_letters(tmp_path):
    pipe = paired_pipe(tmp_path)
    batch_id, staged = write_with_dead_letters(pipe, bad=None)
    assert staged.dead_letters is None and pipe.ledger.get_batch(batch_id).handles["dead_letter"] is None
    pipe.commit(batch_id)
    assert (tmp_path / "out" / "batch_seq=1").is_dir() and not (tmp_path / "out" / "_dead_letter" / "batch_seq=1").exists()


def test_lost_dead_letters_abort_before_the_output_is_visible(tmp_path):
    """notify_complete checks both staged outputs first: a loss makes nothing of the batch visible."""
    pipe = paired_pipe(tmp_path)
    batch_id, staged = write_with_dead_letters(pipe)
    Path(staged.dead_letters.staging, "part-0.parquet").unlink()
    Path(staged.dead_letters.staging).rmdir()
    with pytest.raises(TransactionLostError):
        pipe.commit(batch_id)
    assert not (tmp_path / "out" / "batch_seq=1").exists()
    # What is left of a lost batch is released before the ledger says ABORTED (issue 31).
    assert not Path(staged.output.staging).exists()
    assert pipe.state(batch_id) is BatchState.ABORTED
    assert pipe.abort(batch_id).endswith("already ABORTED and released")


def test_a_failing_dead_letter_stage_takes_the_output_back(tmp_path):
    pipe = paired_pipe(tmp_path)

    class Refusing(MarkerWriter):
        def stage(self, frame, batch, run_writers):
            raise RuntimeError("the dead-letter destination refused")

    pipe.writer.dead = Refusing(pipe.writer.dead.spec)
    with pytest.raises(RuntimeError, match="refused"):
        write_with_dead_letters(pipe)
    assert not list((tmp_path / "out" / "_staging").iterdir())



def test_avro_schema_is_checked(tmp_path):
    import json

    record = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}
    stored = config(tmp_path, value_format="avro", value_schema=record).value_schema
    assert json.loads(stored) == record  # a dict is stored as the JSON from_avro takes
    with pytest.raises(ConfigurationError, match="not an Avro schema in JSON"):
        config(tmp_path, value_format="avro", value_schema="id BIGINT")
    with pytest.raises(ConfigurationError, match="an Avro record schema with fields"):
        config(tmp_path, value_format="avro", value_schema='"string"')


def test_the_end_mark_reads_back_only_when_the_record_is_the_whole_data():
    """spark.records reads data + END_MARK_BYTES with end_marked(schema): a cut record, bytes after it, or bytes
    that are no record never give END_MARK back (checked here with another Avro implementation, fastavro)."""
    import io
    import json

    import fastavro

    from airflow_exactly_once.records.avro_schema import END_MARK, END_MARK_BYTES, end_marked

    schema = json.dumps({"type": "record", "name": "R", "namespace": "shop", "fields": [
        {"name": "id", "type": "long"}, {"name": "note", "type": ["null", "string"]}]})
    marked = fastavro.parse_schema(json.loads(end_marked(schema)))
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(json.loads(schema)), {"id": -5, "note": "a note"})
    data = body.getvalue()

    def end_of(value: bytes) -> int | None:
        try:
            return fastavro.schemaless_reader(io.BytesIO(value + END_MARK_BYTES), marked)["end"]
        except Exception:  # what Spark's PERMISSIVE mode turns into nulls
            return None

    assert len(END_MARK_BYTES) == 10
    assert end_of(data) == END_MARK
    assert fastavro.schemaless_reader(io.BytesIO(data + END_MARK_BYTES), marked)["record"] == {"id": -5,
                                                                                              "note": "a note"}
    for cut in range(1, len(data)):
        assert end_of(data[:-cut]) != END_MARK, cut
    for extra in (b"\x00", b"\x02", b"\x7f", b"\xff" * 3, data):
        assert end_of(data + extra) != END_MARK, extra
    assert end_of(b"") != END_MARK and end_of(b"\xff\xff") != END_MARK


def test_a_bad_record_stop_is_found_anywhere_in_the_exception_chain():
    """The one-pass write's raise_error reaches the driver wrapped (Spark's job failure, a sink's own error):
    its marker is found through causes and contexts, a chain that loops ends, other failures are not it."""
    from airflow_exactly_once.spark.records import BAD_RECORD_FOUND, found_bad_record

    task = RuntimeError(f"Job aborted: [USER_RAISED_EXCEPTION] {BAD_RECORD_FOUND}a null value (a tombstone)")
    wrapped = TransactionLostError("the write failed")
    wrapped.__cause__ = task
    assert found_bad_record(task) and found_bad_record(wrapped)
    other = ValueError("disk full")
    looped = RuntimeError("the broker went away")
    looped.__context__ = other
    other.__context__ = looped
    assert not found_bad_record(looped)


def test_the_batch_reads_back_what_the_write_kept_of_its_bad_records():
    """The write keeps BadRecordCounts.details in the ledger (JSON); Batch.bad_records reads it back typed, and a
    batch without bad records, skips or a replaced batch says so."""
    from airflow_exactly_once.core.model import Batch, BadRecordsNote

    first = [{"topic": "t", "partition": 1, "offset": 7, "error": "not JSON", "value": b"{"}]
    details = BadRecordCounts(10, undecodable=2, marked_by_transform=1, first=first).details("skip")
    batch = Batch("p", 3, "run", BatchState.PREPARED, 1, (), details={**details, "skipped": ["t[0] 0..5"],
                                                                        "replaces": 2})
    assert batch.bad_records == BadRecordsNote(3, "skip", 2, 1, ({"topic": "t", "partition": 1, "offset": 7,
                                                                 "error": "not JSON"},))
    assert (batch.bad_record_count, batch.skipped, batch.replaces) == (3, ("t[0] 0..5",), 2)
    plain = Batch("p", 4, "run", BatchState.PLANNED, 1, ())
    assert (plain.bad_records, plain.bad_record_count, plain.skipped, plain.replaces) == (None, 0, (), None)
