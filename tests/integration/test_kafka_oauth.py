"""OAUTHBEARER with OIDC client credentials, from the official kafka connection, against a broker that validates tokens.

The secured broker (devtools.kafka_secured) has a SASL_PLAINTEXT listener for OAUTHBEARER whose tokens Kafka's
own OAuthBearerValidatorCallbackHandler verifies (signature against the JWKS of devtools.oauth_provider, issuer,
audience, expiry); ACLs are enforced for the principal User:<client id>. Every client of a pipeline logs in
with its own token: planning and the commit (kafka-python, through kafka.oauth's token provider), the write's
read (Spark's Kafka source: Kafka's Java client and its OAuthBearerLoginCallbackHandler) and the Kafka sink's
writers (librdkafka's oidc method).

The client secret is a secret (DESIGN.md invariant 9): a session-new marker, looked for in the ledger's file,
the logs, what the tasks return (XComs) and Spark's plan.
"""

from __future__ import annotations

import json
import logging
import socket
import uuid
from pathlib import Path

import pytest

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.hooks.kafka import source_kafka_settings
from airflow_exactly_once.kafka.offsets import KafkaOffsetSource
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks import create_committer
from airflow_exactly_once.spark.partition_writers import run_partition_writers
from airflow_exactly_once.spark.write_job import run_write
from tests.conftest import OAUTH_CLIENT, OAUTH_CLIENTS, SECURED_IN, SECURED_OUT
from tests.harness import Pipe, open_ledger
from tests.helpers import assert_exactly_once, create_topic, produce, read_parquet
from tests.kafka_helpers import read_all, settled_ends
from tests.secret_search import files, find_secrets
from tests.integration.test_kafka_security import assert_nothing_happened, refused, upper_value

CONN_ID = "kafka_oauth"
ORIGIN = f"connection {CONN_ID!r}"
SECRET = OAUTH_CLIENTS[OAUTH_CLIENT]


@pytest.fixture
def names(secured_kafka):
    """A fresh input topic (3 partitions), output topic (2 partitions) and pipeline id (its transactional ids'
    prefix), inside the OAuth client's ACLs."""
    tag = uuid.uuid4().hex[:8]
    source, output = f"{SECURED_IN}oauth-{tag}", f"{SECURED_OUT}oauth-{tag}"
    create_topic(secured_kafka.client_config(), source, partitions=3)
    create_topic(secured_kafka.client_config(), output, partitions=2)
    return f"sec-oauth-{tag}", source, output


def use_connection(monkeypatch, broker, **overrides) -> None:
    """The `kafka` connection kafka_oauth, as a deployment defines it (OIDC client credentials in its extra)."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(
        {"conn_type": "kafka", "extra": broker.oauth_connection_extra(OAUTH_CLIENT, **overrides)}))


def pipeline_config(name: str, source: str, sink: dict, **overrides) -> PipelineConfig:
    settings = source_kafka_settings(CONN_ID, None, None)
    return checked(PipelineConfig(pipeline_id=name, topics=[source], sink=sink,
                                  bootstrap_servers=settings.bootstrap_servers, kafka_config=dict(settings.properties),
                                  kafka_origin=settings.origin, kafka_conn_id=CONN_ID, **overrides))


def oauth_pipe(tmp_path: Path, name: str, source: str, sink: dict, **overrides) -> Pipe:
    config = pipeline_config(name, source, sink, **overrides)
    return Pipe(config, open_ledger(tmp_path / "ledger.db"), lambda: KafkaOffsetSource(KafkaSettings.of(config)),
                run_writers=run_partition_writers)


def sent_through_oauth(broker, monkeypatch, tmp_path, names, records: int, sink: dict,
                       **overrides) -> tuple[Pipe, list[str]]:
    """`records` values in the input topic, and a pipeline that reads them through the kafka_oauth connection."""
    name, source, _ = names
    sent = produce(broker.client_config(), source, records)
    use_connection(monkeypatch, broker)
    return oauth_pipe(tmp_path, name, source, sink, **overrides), sent


def test_kafka_to_kafka_pipeline_exactly_once_through_oauthbearer(secured_kafka, names, spark, tmp_path, monkeypatch,
                                                                   caplog):
    """Plan (kafka-python), read (Spark's Java client), write (librdkafka producers), commit (kafka-python): each
    logs in with a token the broker verified; the output is exact and the secret is nowhere."""
    caplog.set_level(logging.INFO)  # what task logs keep (py4j's DEBUG log holds every pickled closure it ships)
    name, source, output = names
    pipe, sent = sent_through_oauth(secured_kafka, monkeypatch, tmp_path, names, 60, {"type": "kafka", "topic": output},
                                    local_read_max_records=0)
    settings = KafkaSettings.of(pipe.config)
    assert settings.uses_oauth and settings.origin == ORIGIN
    tokens_before = secured_kafka.oauth.token_requests

    returned = []  # what the tasks hand Airflow (their XComs)
    for run in ("run-1", "run-2"):
        if run == "run-2":
            sent += produce(secured_kafka.client_config(), source, 30, start=60)
        outcome = pipe.plan(run)
        returned.append(repr(outcome))
        batch_id = outcome.batch.id
        report = run_write(spark, pipe.coordinator, batch_id, transform=upper_value)
        assert report["action"] == "prepared", report
        returned.append(json.dumps(report, default=str))
        returned.append(pipe.commit(batch_id))
        assert pipe.state(batch_id) is BatchState.COMMITTED

    assert_exactly_once([v.upper() for v in sent], read_all(secured_kafka.client_config(), output))
    assert sum(b.input_records for b in pipe.ledger.list_batches(name)) == 90
    assert set(pipe.ledger.committed_positions(name)) == {(source, p) for p in range(3)}
    # The brokers saw tokens, not secrets: the provider issued some (kafka-python reuses its cached token).
    assert secured_kafka.oauth.token_requests > tokens_before
    stored = pipe.ledger.pipeline(name)["config"]["kafka_config"]
    assert stored["sasl.oauthbearer.client.secret"] == "***" and stored["sasl.oauthbearer.client.id"] == OAUTH_CLIENT

    frame_plan = spark.read.format("kafka").options(**settings.spark_source_options()).option(
        "subscribe", source).load()._jdf.queryExecution().toString()
    stores = [*files(tmp_path, "tmp_path"), ("logs", caplog.text), ("returned", "\n".join(returned)),
              ("spark plan", frame_plan)]
    assert find_secrets({"oauth-client-secret": SECRET}, stores) == []


# --------------------------------------------------------------------------- bad input


def test_a_wrong_client_secret_fails_the_plan_at_once_naming_the_setting(secured_kafka, names, tmp_path, monkeypatch):
    """The token endpoint refuses the client (401 invalid_client): not retriable, named with the settings to fix,
    before any broker is asked; for the Kafka sink's plan-time checks too."""
    name, source, output = names
    wrong = f"SECRET-wrong-{uuid.uuid4().hex}"
    use_connection(monkeypatch, secured_kafka, **{"sasl.oauthbearer.client.secret": wrong})
    for sink in ({"type": "parquet", "path": str(tmp_path / "out")}, {"type": "kafka", "topic": output}):
        pipe = oauth_pipe(tmp_path, f"{name}-{sink['type']}", source, sink)
        message = str(refused(lambda: pipe.plan("run-1")))
        assert f"{secured_kafka.oauth.token_url} (sasl.oauthbearer.token.endpoint.url of {ORIGIN})" in message
        assert f"refused the client credentials of client {OAUTH_CLIENT!r} (HTTP 401 invalid_client" in message
        assert f"fix sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret in {ORIGIN}" in message
        assert wrong not in message
        assert_nothing_happened(pipe)
    assert read_parquet(tmp_path / "out") == []
    assert set(settled_ends(secured_kafka.client_config(), output).values()) == {0}


@pytest.mark.parametrize("endpoint", ["unreachable", "not-a-token-endpoint"])
def test_a_token_endpoint_that_cannot_answer_fails_the_plan_at_once_naming_the_url(secured_kafka, names, tmp_path,
                                                                                   monkeypatch, endpoint):
    name, source, _ = names
    with socket.socket() as bound:  # a port that refuses: bound, never listening
        bound.bind(("127.0.0.1", 0))
        url = (f"http://127.0.0.1:{bound.getsockname()[1]}/token" if endpoint == "unreachable"
               else secured_kafka.oauth.jwks_url)  # the provider's JWKS: 404 to a token request
        use_connection(monkeypatch, secured_kafka, **{"sasl.oauthbearer.token.endpoint.url": url})
        pipe = oauth_pipe(tmp_path, name, source, {"type": "parquet", "path": str(tmp_path / "out")})
        message = str(refused(lambda: pipe.plan("run-1")))
    assert f"the OAuth token endpoint {url} (sasl.oauthbearer.token.endpoint.url of {ORIGIN})" in message
    if endpoint == "unreachable":
        assert "cannot be reached" in message and "set sasl.oauthbearer.token.endpoint.url to" in message
    else:
        assert "answered HTTP 404" in message and "check that the URL is the provider's token endpoint" in message
    assert SECRET not in message
    assert_nothing_happened(pipe)


@pytest.mark.parametrize("reader", ["spark", "local"])
def test_a_client_secret_rotated_after_planning_fails_the_write_naming_the_setting(secured_kafka, names, spark,
                                                                                   tmp_path, monkeypatch, reader):
    """Planning worked; then the connection's secret changed: the write's reader (Spark's Java client, or the
    small-batch read with librdkafka) gets no token, and the write names the settings, not retriable."""
    name, source, _ = names
    output = tmp_path / "out"
    pipe, _ = sent_through_oauth(secured_kafka, monkeypatch, tmp_path, names, 30,
                                 {"type": "parquet", "path": str(output)},
                                 local_read_max_records=0 if reader == "spark" else 5000)
    batch_id = pipe.plan("run-1").batch.id
    wrong = f"SECRET-rotated-{uuid.uuid4().hex}"
    use_connection(monkeypatch, secured_kafka, **{"sasl.oauthbearer.client.secret": wrong})
    config = pipeline_config(name, source, pipe.config.sink, local_read_max_records=pipe.config.local_read_max_records)
    writer = BatchCoordinator(config, pipe.ledger, create_committer(config.sink))

    message = str(refused(lambda: run_write(spark, writer, batch_id)))
    assert f"could not get an OAuth token for client {OAUTH_CLIENT!r}" in message
    assert "fix sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret" in message and ORIGIN in message
    assert wrong not in message and SECRET not in message
    assert pipe.state(batch_id) is BatchState.PLANNED
    assert "ABORTED" in writer.abort(batch_id, "the write failed for good")
    assert read_parquet(output) == []


def test_a_token_the_broker_does_not_accept_is_named(secured_kafka, names, tmp_path, monkeypatch):
    """The token endpoint answers, but with tokens the brokers do not trust (signed by keys their JWKS does not
    hold): the brokers refuse the login, and the error says what they check."""
    from devtools.oauth_provider import LocalOAuthProvider

    name, source, _ = names
    with LocalOAuthProvider(OAUTH_CLIENTS) as stranger:  # same client, keys the broker's JWKS does not hold
        use_connection(monkeypatch, secured_kafka, **{"sasl.oauthbearer.token.endpoint.url": stranger.token_url})
        pipe = oauth_pipe(tmp_path, name, source, {"type": "parquet", "path": str(tmp_path / "out")})
        message = str(refused(lambda: pipe.plan("run-1")))
    assert f"refused the OAuth token of OAuth client {OAUTH_CLIENT!r}" in message
    assert "sasl.oauthbearer.jwks.endpoint.url" in message and ORIGIN in message
    assert SECRET not in message
    assert_nothing_happened(pipe)


def test_the_write_on_spark_connect_reads_and_writes_through_oauthbearer(secured_kafka, names, spark_connect, tmp_path,
                                                                         monkeypatch):
    """The same connection on a warm Spark Connect server: its Kafka source (Java's client, jose4j on the server)
    and the Kafka sink's producers on its executors log in with their own tokens."""
    from airflow_exactly_once.spark.launch.connect import ConnectWrite

    name, source, output = names
    pipe, sent = sent_through_oauth(secured_kafka, monkeypatch, tmp_path, names, 45, {"type": "kafka", "topic": output},
                                    local_read_max_records=0)
    batch_id = pipe.plan("run-1").batch.id
    report = ConnectWrite(pipe.coordinator, spark_connect.url, upper_value).run(batch_id)
    assert report["action"] == "prepared" and report["output_records"] == 45, report
    assert SECRET not in json.dumps(report, default=str)
    assert "COMMITTED" in pipe.commit(batch_id)
    assert_exactly_once([v.upper() for v in sent], read_all(secured_kafka.client_config(), output))


def test_the_write_through_spark_submit_reads_and_writes_through_oauthbearer(secured_kafka, names, tmp_path,
                                                                             monkeypatch, caplog, capfd):
    """The third launcher: spark-submit with `--master local[1]` (client mode, the cheapest real submission: one
    JVM of its own, no standalone cluster), the job reading the ledger and the secret from its environment. Its
    Kafka source and the sink's producers log in with their own tokens; the secret is not on the command line, in
    spark-submit's output (the task's log), in the ledger or in what the task returns."""
    from airflow_exactly_once.hooks.spark_submit import WriteJobSubmitHook
    from airflow_exactly_once.spark.launch.submit import SparkSubmitWrite

    commands: list[list[str]] = []

    class RecordingHook(WriteJobSubmitHook):
        def _build_spark_submit_command(self, application: str) -> list[str]:
            commands.append(super()._build_spark_submit_command(application))
            return commands[-1]

    caplog.set_level(logging.INFO)
    name, _, output = names
    pipe, sent = sent_through_oauth(secured_kafka, monkeypatch, tmp_path, names, 40, {"type": "kafka", "topic": output},
                                    local_read_max_records=0)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL_ONE", json.dumps(
        {"conn_type": "spark", "host": "local[1]", "extra": {"deploy-mode": "client"}}))
    batch_id = pipe.plan("run-1").batch.id
    launcher = SparkSubmitWrite(pipe.coordinator, "spark_local_one", {"spark.ui.enabled": "false"}, None,
                                logging.getLogger("tests.spark_submit"), RecordingHook)
    launcher.start(batch_id)
    report = launcher.wait()

    assert report["action"] == "prepared" and report["output_records"] == 40, report
    assert len(commands) == 1 and "local[1]" in commands[0], commands
    assert "COMMITTED" in pipe.commit(batch_id)
    assert_exactly_once(sent, read_all(secured_kafka.client_config(), output))
    task_log = "\n".join(capfd.readouterr())  # the hook logs spark-submit's output through Airflow's logging
    assert "Running Spark version" in task_log  # the job's own output, not only the hook's
    stores = [*files(tmp_path, "tmp_path"), ("spark-submit command", " ".join(commands[0])),
              ("task log", task_log), ("logs", caplog.text), ("returned", json.dumps(report, default=str))]
    assert find_secrets({"oauth-client-secret": SECRET}, stores) == []
