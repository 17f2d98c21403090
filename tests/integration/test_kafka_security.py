"""The official kafka connection's security settings, end to end, against a real secured broker.

The broker (devtools.kafka_secured) serves only SASL_SSL: SCRAM-SHA-512 logins over TLS with a
CA made at start-up, and ACLs enforced (users and grants in tests/conftest.py). Each pipeline
reads its settings through the provider's own hook from an `AIRFLOW_CONN_KAFKA_SECURED`
connection, and runs the production path: planning with the offset source (kafka-python),
the write with real Spark reading through Spark's Java client, the sink's writers on the
executors and its committer.

The bad-input tests each break one thing a platform team gets wrong (password, CA, an ACL) and
check three things: the error names the problem and the setting or grant to change and where
the settings came from; it is not retriable and arrives in seconds; and the ledger and the sink
are left consistent (no batch, or one that aborts with nothing visible, offsets unmoved).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import AbortTransactionSpec

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import (
    ConfigurationError,
    ExactlyOnceError,
    SourceUnavailableError,
    TransactionLostError,
)
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.hooks.kafka import source_kafka_settings
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import create_committer
from airflow_exactly_once.spark.partition_writers import run_partition_writers
from airflow_exactly_once.spark.write_job import run_write
from devtools.kafka_secured import Grant
from devtools.tls import make_ca
from tests.conftest import (
    NO_READ_USER,
    NO_TXN_USER,
    NO_WRITE_USER,
    PIPELINE_USER,
    SECURED_CONN_ID,
    SECURED_IN,
    SECURED_OUT,
)
from tests.harness import Pipe, open_ledger
from tests.helpers import assert_exactly_once, assert_ranges_tile, create_topic, produce, read_parquet
from tests.kafka_helpers import lose_coordinator_state, read_all, settled_ends

ORIGIN = f"connection {SECURED_CONN_ID!r}"
# A refused login or certificate is known after the planning client's bootstrap wait (10 s) and one
# diagnosis (seconds); kafka-python alone would wait 30 s and then say only "Unable to bootstrap".
FAST_S = 25.0


def upper_value(df):
    return df.selectExpr("key", "upper(CAST(value AS STRING)) AS value")


@pytest.fixture
def names(secured_kafka):
    """A fresh input topic (3 partitions), output topic (2 partitions) and pipeline id, made by the admin."""
    tag = uuid.uuid4().hex[:8]
    source, output = f"{SECURED_IN}{tag}", f"{SECURED_OUT}{tag}"
    create_topic(secured_kafka.client_config(), source, partitions=3)
    create_topic(secured_kafka.client_config(), output, partitions=2)
    return f"sec-{tag}", source, output


def use_connection(monkeypatch, broker, user: str = PIPELINE_USER, **extra) -> None:
    """The `kafka` connection kafka_secured, as a deployment defines it (an AIRFLOW_CONN_ variable)."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{SECURED_CONN_ID.upper()}",
                       json.dumps({"conn_type": "kafka", "extra": broker.connection_extra(user, **extra)}))


def pipeline_config(name: str, source: str, sink: dict, **overrides) -> PipelineConfig:
    """What the operators make of kafka_conn_id='kafka_secured' (operators.base.pipeline_config)."""
    settings = source_kafka_settings(SECURED_CONN_ID, None, None)
    return checked(PipelineConfig(pipeline_id=name, topics=[source], sink=sink, bootstrap_servers=settings.bootstrap_servers,
                          kafka_config=dict(settings.properties), kafka_origin=settings.origin,
                          **overrides))


def secured_pipe(tmp_path: Path, name: str, source: str, sink: dict, **overrides) -> Pipe:
    config = pipeline_config(name, source, sink, **overrides)
    return Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)),
                run_writers=run_partition_writers)


def write_as(monkeypatch, broker, pipe: Pipe, user: str, **extra) -> BatchCoordinator:
    """The write task's coordinator after the connection was changed to `user` (same pipeline, same ledger)."""
    use_connection(monkeypatch, broker, user, **extra)
    config = pipeline_config(pipe.config.pipeline_id, pipe.config.topics[0], pipe.config.sink,
                             max_records_per_partition=pipe.config.max_records_per_partition,
                             local_read_max_records=pipe.config.local_read_max_records)
    return BatchCoordinator(config, pipe.ledger, create_committer(config.sink))


def refused(call, error: type[ExactlyOnceError] = ConfigurationError) -> ExactlyOnceError:
    """Run `call`, which must fail with `error`, not retriable, quickly."""
    started = time.monotonic()
    with pytest.raises(error) as caught:
        call()
    elapsed = time.monotonic() - started
    assert elapsed < FAST_S, f"finding out took {elapsed:.0f} s: {caught.value}"
    assert caught.value.retriable is (error is not ConfigurationError), caught.value
    return caught.value


def assert_nothing_happened(pipe: Pipe) -> None:
    assert pipe.ledger.list_batches(pipe.config.pipeline_id) == []
    assert pipe.ledger.committed_positions(pipe.config.pipeline_id) == {}


# --------------------------------------------------------------------------- exactly once through SASL_SSL


def test_parquet_pipeline_exactly_once_through_sasl_ssl(secured_kafka, names, spark, tmp_path, monkeypatch):
    name, source, _ = names
    sent = produce(secured_kafka.client_config(), source, 90)
    use_connection(monkeypatch, secured_kafka)
    output = tmp_path / "out"
    pipe = secured_pipe(tmp_path, name, source, {"type": "parquet", "path": str(output)},
                        max_records_per_partition=20)
    assert KafkaSettings.of(pipe.config).origin == ORIGIN and KafkaSettings.of(pipe.config).security_protocol == "SASL_SSL"

    for run in ("run-1", "run-2"):  # 20 + 10 offsets per partition
        batch_id = pipe.plan(run).batch.id
        summary = run_write(spark, pipe.coordinator, batch_id, transform=upper_value)
        assert summary["action"] == "prepared", summary
        assert "COMMITTED" in pipe.commit(batch_id)

    assert_exactly_once([v.upper() for v in sent], [row["value"] for row in read_parquet(output)])
    assert [b.input_records for b in pipe.ledger.list_batches(name, newest_first=False)] == [60, 30]
    assert_ranges_tile(pipe.ledger, name)
    assert pipe.ledger.committed_positions(name) == {(source, p): 30 for p in range(3)}
    # The ledger keeps the connection's settings without the password.
    stored = pipe.ledger.pipeline(name)["config"]["kafka_config"]
    assert stored["sasl.password"] == "***" and stored["sasl.username"] == PIPELINE_USER


def test_kafka_sink_pipeline_exactly_once_through_sasl_ssl(secured_kafka, names, spark, tmp_path, monkeypatch):
    name, source, output = names
    sent = produce(secured_kafka.client_config(), source, 60)
    use_connection(monkeypatch, secured_kafka)
    pipe = secured_pipe(tmp_path, name, source, {"type": "kafka", "topic": output})

    batch_id = pipe.plan("run-1").batch.id
    assert run_write(spark, pipe.coordinator, batch_id, transform=upper_value)["action"] == "prepared"
    prepared = pipe.ledger.get_batch(batch_id)
    writers = prepared.handles["writers"]  # one transaction per Spark partition (of a local relation: 60 records)
    assert writers and all(w["transaction"]["transactional_id"].startswith(f"{name}-1-") for w in writers)
    # Without READ on the output the brokers refuse DescribeProducers: each writer took where its transaction
    # begins from its delivery reports instead.
    assert all(w["first_offsets"] for w in prepared.handles["writers"]), prepared.handles
    assert read_all(secured_kafka.client_config(), output, settle=False) == []  # pre-committed: invisible
    assert "COMMITTED" in pipe.commit(batch_id)

    admin = secured_kafka.client_config()
    assert_exactly_once([v.upper() for v in sent], read_all(admin, output))
    assert sorted(read_all(admin, output, "read_uncommitted")) == sorted(v.upper() for v in sent)
    assert pipe.ledger.committed_positions(name) == {(source, p): 20 for p in range(3)}


def test_a_hanging_transaction_without_alter_on_the_cluster_fails_for_good_naming_the_grant(secured_kafka, names,
                                                                                           spark, tmp_path, monkeypatch):
    """The coordinator lost a PREPARED batch's transactions (its __transaction_state logs removed), so they hang in
    the output. The pipeline's user may find them (READ on the output) but not end them (no ALTER on the Cluster):
    notify_complete fails at once, not retried, naming the grant and the commands; nothing is aborted or committed.
    Once an operator ran the commands, notify_complete finds the batch lost and the range is processed again."""
    name, source, output = names
    secured_kafka.grant([Grant(PIPELINE_USER, "READ", "TOPIC", output, prefixed=False)])
    produce(secured_kafka.client_config(), source, 30)
    use_connection(monkeypatch, secured_kafka)
    pipe = secured_pipe(tmp_path, name, source, {"type": "kafka", "topic": output})
    batch_id = pipe.plan("run-1").batch.id
    assert run_write(spark, pipe.coordinator, batch_id, transform=upper_value)["action"] == "prepared"
    lose_coordinator_state(secured_kafka)

    error = refused(lambda: pipe.commit(batch_id))
    assert "needs ALTER on the Cluster resource" in str(error) and "--operation Alter --cluster" in str(error)
    commands = re.findall(r"kafka-transactions\.sh --bootstrap-server \S+ abort --topic (\S+) --partition (\d+) "
                          r"--producer-id (\d+) --producer-epoch (\d+) --coordinator-epoch (\d+)", str(error))
    assert commands and {c[0] for c in commands} == {output}
    assert pipe.ledger.get_batch(batch_id).state is BatchState.PREPARED
    assert read_all(secured_kafka.client_config(), output, settle=False) == []  # still held back: nothing ended

    admin = KafkaAdminClient(**secured_kafka.client_config())  # the operator, with the grant, runs the commands
    try:
        for topic, partition, pid, epoch, coordinator_epoch in commands:
            admin.abort_transaction(AbortTransactionSpec(TopicPartition(topic, int(partition)), int(pid), int(epoch),
                                                         int(coordinator_epoch)))
    finally:
        admin.close()
    with pytest.raises(TransactionLostError):
        pipe.commit(batch_id)
    assert pipe.ledger.get_batch(batch_id).state is BatchState.ABORTED
    assert pipe.plan("run-2").batch.ranges == pipe.ledger.get_batch(batch_id).ranges


# --------------------------------------------------------------------------- bad input


def test_a_wrong_password_fails_the_plan_at_once_naming_the_setting(secured_kafka, names, tmp_path, monkeypatch):
    name, source, output = names
    use_connection(monkeypatch, secured_kafka, password="not-the-password")
    for sink in ({"type": "parquet", "path": str(tmp_path / "out")}, {"type": "kafka", "topic": output}):
        pipe = secured_pipe(tmp_path, f"{name}-{sink['type']}", source, sink)  # the kafka sink's check comes first
        error = refused(lambda: pipe.plan("run-1"))
        message = str(error)
        assert f"refused the SASL login of user {PIPELINE_USER!r}" in message
        assert "fix sasl.username and sasl.password" in message and ORIGIN in message
        assert_nothing_happened(pipe)
    assert read_parquet(tmp_path / "out") == []
    assert set(settled_ends(secured_kafka.client_config(), output).values()) == {0}


def test_an_untrusted_certificate_fails_the_plan_at_once_naming_the_setting(secured_kafka, names, tmp_path,
                                                                             monkeypatch):
    name, source, output = names
    stranger = make_ca(tmp_path / "other-ca", common_name="a CA that did not sign the broker's certificate")
    use_connection(monkeypatch, secured_kafka, **{"ssl.ca.location": str(stranger.certificate)})
    for sink in ({"type": "parquet", "path": str(tmp_path / "out")}, {"type": "kafka", "topic": output}):
        pipe = secured_pipe(tmp_path, f"{name}-{sink['type']}", source, sink)
        error = refused(lambda: pipe.plan("run-1"))
        message = str(error)
        assert "is not signed by a CA the client trusts" in message
        assert f"ssl.ca.location={stranger.certificate}" in message and ORIGIN in message
        assert "set ssl.ca.location to the PEM file of the CA" in message
        assert_nothing_happened(pipe)


def test_an_acl_denying_the_output_topic_fails_the_plan(secured_kafka, names, tmp_path, monkeypatch):
    name, source, output = names
    use_connection(monkeypatch, secured_kafka, NO_WRITE_USER)
    pipe = secured_pipe(tmp_path, name, source, {"type": "kafka", "topic": output})
    message = str(refused(lambda: pipe.plan("run-1")))
    assert f"do not let user {NO_WRITE_USER!r} of {ORIGIN} WRITE and DESCRIBE topic(s) {output}" in message
    assert f"--allow-principal User:{NO_WRITE_USER} --operation Write --operation Describe --topic {output}" in message
    assert_nothing_happened(pipe)


def test_an_acl_denying_the_output_topic_after_planning_fails_the_write(secured_kafka, names, spark, tmp_path,
                                                                        monkeypatch):
    """The connection changed to a user without WRITE between plan and write: the executors' producers are
    refused; the batch is aborted with nothing visible and its range is planned again."""
    name, source, output = names
    produce(secured_kafka.client_config(), source, 30)
    use_connection(monkeypatch, secured_kafka)
    pipe = secured_pipe(tmp_path, name, source, {"type": "kafka", "topic": output})
    batch_id = pipe.plan("run-1").batch.id
    writer = write_as(monkeypatch, secured_kafka, pipe, NO_WRITE_USER)

    message = str(refused(lambda: run_write(spark, writer, batch_id, transform=upper_value)))
    assert f"do not let user {NO_WRITE_USER!r} of {ORIGIN} WRITE and DESCRIBE topic(s) {output}" in message
    assert "TOPIC_AUTHORIZATION_FAILED" in message  # what the producer (librdkafka) said
    assert pipe.state(batch_id) is BatchState.PLANNED
    assert "ABORTED" in writer.abort(batch_id, "the write failed for good")
    assert pipe.state(batch_id) is BatchState.ABORTED
    assert set(settled_ends(secured_kafka.client_config(), output).values()) == {0}
    assert set(pipe.ledger.committed_positions(name).values()) == {0}  # the range is planned again


def test_an_acl_denying_the_transactional_ids_fails_the_write(secured_kafka, names, spark, tmp_path, monkeypatch):
    """No WRITE on the transactional ids: nothing at plan time can tell (no API asks without side effects), so
    the first InitProducerId of the write is refused; the error names the prefix to grant."""
    name, source, output = names
    produce(secured_kafka.client_config(), source, 30)
    use_connection(monkeypatch, secured_kafka, NO_TXN_USER)
    pipe = secured_pipe(tmp_path, name, source, {"type": "kafka", "topic": output})
    batch_id = pipe.plan("run-1").batch.id  # the topic ACLs and the broker's timeout check pass

    message = str(refused(lambda: run_write(spark, pipe.coordinator, batch_id, transform=upper_value)))
    assert f"do not let user {NO_TXN_USER!r} of {ORIGIN} use its transactional ids" in message
    assert f"grant WRITE and DESCRIBE on the transactional ids with prefix {name!r}" in message
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in message  # what the producer (librdkafka) said
    assert "ABORTED" in pipe.abort(batch_id)
    assert set(settled_ends(secured_kafka.client_config(), output).values()) == {0}  # not even aborted records
    assert set(pipe.ledger.committed_positions(name).values()) == {0}


@pytest.mark.parametrize("reader", ["spark", "local"])
@pytest.mark.parametrize("problem", ["password", "read-acl"])
def test_what_the_readers_client_reports_in_the_write_is_explained(secured_kafka, names, spark, tmp_path,
                                                                   monkeypatch, problem, reader):
    """Planning worked; then the connection's password changed, or the user lost READ on the input: the read of
    the write fails, by Spark's Kafka source (Java's client) or by the small-batch read (librdkafka), and the
    write step names the setting or grant."""
    name, source, _ = names
    produce(secured_kafka.client_config(), source, 30)
    use_connection(monkeypatch, secured_kafka)
    output = tmp_path / "out"
    pipe = secured_pipe(tmp_path, name, source, {"type": "parquet", "path": str(output)},
                        local_read_max_records=0 if reader == "spark" else 5000)
    batch_id = pipe.plan("run-1").batch.id
    if problem == "password":
        writer = write_as(monkeypatch, secured_kafka, pipe, PIPELINE_USER, password="rotated-away")
        expected = [f"refused the SASL login of user {PIPELINE_USER!r}"]
        said = {"spark": "SaslAuthenticationException", "local": "Authentication failed"}
    else:
        writer = write_as(monkeypatch, secured_kafka, pipe, NO_READ_USER)
        expected = [f"do not let user {NO_READ_USER!r} of {ORIGIN} READ and DESCRIBE topic(s) {source}"]
        said = {"spark": "TopicAuthorizationException", "local": "TOPIC_AUTHORIZATION_FAILED"}

    message = str(refused(lambda: run_write(spark, writer, batch_id)))
    for part in expected + [said[reader]]:
        assert part in message
    assert pipe.state(batch_id) is BatchState.PLANNED
    assert "ABORTED" in writer.abort(batch_id, "the write failed for good")
    assert read_parquet(output) == [] and not list((output / "_staging").glob("*"))


def test_servers_that_refuse_connections_fail_the_plan_within_seconds(tmp_path, monkeypatch):
    """Nothing listens: retriable (a broker may be restarting), but known in seconds, with the address."""
    import socket

    with socket.socket() as bound:  # a port that refuses: bound, never listening
        bound.bind(("127.0.0.1", 0))
        server = f"127.0.0.1:{bound.getsockname()[1]}"
        monkeypatch.setenv(f"AIRFLOW_CONN_{SECURED_CONN_ID.upper()}", json.dumps({"conn_type": "kafka", "extra": {
            "bootstrap.servers": server, "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "u", "sasl.password": "p"}}))
        pipe = secured_pipe(tmp_path, "sec-unreachable", f"{SECURED_IN}x", {"type": "parquet",
                                                                           "path": str(tmp_path / "out")})
        error = refused(lambda: pipe.plan("run-1"), SourceUnavailableError)
    assert f"no Kafka broker answered at '{server}' ({server}: Connection refused)" in str(error)
    assert ORIGIN in str(error)
    assert_nothing_happened(pipe)


@pytest.mark.parametrize("listener", ["tls", "plaintext"])
def test_a_security_protocol_that_does_not_match_the_listener_is_named(kafka, secured_kafka, tmp_path, monkeypatch,
                                                                      listener):
    """SASL_PLAINTEXT against the TLS listener, or SSL against a plaintext one: kafka-python only times out;
    the diagnosis tells which setting is wrong."""
    if listener == "tls":
        extra = secured_kafka.connection_extra(PIPELINE_USER, **{"security.protocol": "SASL_PLAINTEXT"})
        expected = "closed the connection on a plaintext request: it expects TLS; set security.protocol=SSL"
    else:
        extra = {"bootstrap.servers": kafka.bootstrap_servers, "security.protocol": "SSL",
                 "ssl.ca.location": str(secured_kafka.ca_file)}
        expected = "does not speak TLS, but connection 'kafka_secured' says security.protocol=SSL"
    monkeypatch.setenv(f"AIRFLOW_CONN_{SECURED_CONN_ID.upper()}", json.dumps({"conn_type": "kafka", "extra": extra}))
    pipe = secured_pipe(tmp_path, "sec-protocol", f"{SECURED_IN}x", {"type": "parquet", "path": str(tmp_path / "out")})
    assert expected in str(refused(lambda: pipe.plan("run-1")))
    assert_nothing_happened(pipe)


def test_an_input_topic_the_user_may_not_describe_is_named_with_the_grant(secured_kafka, tmp_path, monkeypatch):
    """The brokers hide topics a user may not DESCRIBE: to the client it does not exist, so the message says both."""
    hidden = f"hidden-{uuid.uuid4().hex[:8]}"  # outside the pipeline user's "sec-in-" ACLs
    create_topic(secured_kafka.client_config(), hidden, partitions=1)
    use_connection(monkeypatch, secured_kafka)
    pipe = secured_pipe(tmp_path, "sec-hidden", hidden, {"type": "parquet", "path": str(tmp_path / "out")})
    message = str(refused(lambda: pipe.plan("run-1")))
    assert f"Kafka topic {hidden!r} does not exist" in message
    assert f"or grant user {PIPELINE_USER!r} of {ORIGIN} READ and DESCRIBE on it" in message
    assert_nothing_happened(pipe)
