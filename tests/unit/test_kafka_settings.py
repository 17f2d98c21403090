"""One translation of the official kafka connection's settings, for every client that needs them."""

from __future__ import annotations

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.kafka.access import explain_refusal
from airflow_exactly_once.kafka.setting_names import canonical_name
from airflow_exactly_once.kafka.settings import KafkaSettings

SCRAM = {"bootstrap.servers": "b1:9093,b2:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
         "sasl.username": "app", "sasl.password": 'pa"ss\\word', "ssl.ca.location": "/etc/kafka/ca.pem",
         "client.id": "eo", "fetch.max.bytes": "1048576", "linger.ms": 5}


def test_connection_extra_in_librdkafka_names_reaches_kafka_python():
    settings = KafkaSettings.from_mapping(SCRAM, origin="connection 'kafka_default'").check()
    assert settings.bootstrap_servers == "b1:9093,b2:9093" and settings.origin == "connection 'kafka_default'"
    consumer = settings.kafka_python(KafkaConsumer)
    assert consumer == {"bootstrap_servers": "b1:9093,b2:9093", "security_protocol": "SASL_SSL",
                        "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "app",
                        "sasl_plain_password": 'pa"ss\\word', "ssl_cafile": "/etc/kafka/ca.pem",
                        "ssl_check_hostname": True, "client_id": "eo", "fetch_max_bytes": 1048576}
    producer = settings.kafka_python(KafkaProducer)
    assert "fetch_max_bytes" not in producer and producer["linger_ms"] == 5  # each client gets its own
    assert "linger_ms" not in settings.kafka_python(KafkaAdminClient)


def test_the_same_settings_for_sparks_java_client():
    java = KafkaSettings.from_mapping(SCRAM).java()
    assert java["sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                        'username="app" password="pa\\"ss\\\\word";')
    assert java["ssl.truststore.type"] == "PEM" and java["ssl.truststore.location"] == "/etc/kafka/ca.pem"
    assert "sasl.password" not in java and "ssl.ca.location" not in java
    options = KafkaSettings.from_mapping(SCRAM).spark_source_options()
    assert options["kafka.bootstrap.servers"] == "b1:9093,b2:9093" and options["kafka.security.protocol"] == "SASL_SSL"


def test_kafka_pythons_bootstrap_timeout_reaches_no_other_client():
    """bootstrap.timeout.ms is kafka-python's: confluent-kafka refuses an unknown property ("No such configuration
    property"), so the Kafka sink's producers would fail on a connection that sets it."""
    from confluent_kafka import Producer

    settings = KafkaSettings.from_mapping({"bootstrap.servers": "127.0.0.1:9", "bootstrap.timeout.ms": "5000"})
    assert settings.kafka_python(KafkaConsumer)["bootstrap_timeout_ms"] == 5000
    assert "bootstrap.timeout.ms" not in settings.librdkafka() and "bootstrap.timeout.ms" not in settings.java()
    Producer(settings.librdkafka()).flush(0)  # accepted: raises KafkaException on a property it does not know


def test_a_java_style_jaas_config_also_serves_the_python_clients():
    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required username="u1" password="p w";'
    settings = KafkaSettings.from_mapping({"bootstrap.servers": "b:9092", "security.protocol": "SASL_PLAINTEXT",
                                           "sasl.mechanism": "PLAIN", "sasl.jaas.config": jaas}).check()
    assert settings.sasl_credentials() == ("u1", "p w")
    assert settings.kafka_python(KafkaAdminClient)["sasl_plain_password"] == "p w"
    assert settings.java()["sasl.jaas.config"] == jaas
    assert settings.librdkafka()["sasl.username"] == "u1" and "sasl.jaas.config" not in settings.librdkafka()


def test_client_certificates_go_inline_to_java(tmp_path):
    (tmp_path / "client.pem").write_text("-----BEGIN CERTIFICATE-----\nabc\n")
    (tmp_path / "client.key").write_text("-----BEGIN PRIVATE KEY-----\nxyz\n")
    settings = KafkaSettings.from_mapping({"bootstrap.servers": "b:9093", "security.protocol": "SSL",
                                           "ssl.ca.location": "/ca.pem",
                                           "ssl.certificate.location": str(tmp_path / "client.pem"),
                                           "ssl.key.location": str(tmp_path / "client.key"),
                                           "ssl.key.password": "kp",
                                           "ssl.endpoint.identification.algorithm": "none"}).check()
    python = settings.kafka_python(KafkaProducer)
    assert python["ssl_certfile"].endswith("client.pem") and python["ssl_keyfile"].endswith("client.key")
    assert python["ssl_password"] == "kp" and python["ssl_check_hostname"] is False
    java = settings.java()
    assert java["ssl.keystore.type"] == "PEM" and "abc" in java["ssl.keystore.certificate.chain"]
    assert "xyz" in java["ssl.keystore.key"] and java["ssl.endpoint.identification.algorithm"] == ""


@pytest.mark.parametrize("settings, message", [
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism set to one of"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "needs credentials"),
    ({"security.protocol": "TLS"}, "security.protocol='TLS'"),
    ({"security.protocol": "SSL", "ssl.truststore.location": "/ts.jks"}, "give the CA certificate as PEM"),
    ({"enable.auto.commit": "true"}, "must not set enable.auto.commit"),
])
def test_settings_no_client_can_use_are_refused_with_the_fix(settings, message):
    with pytest.raises(ConfigurationError, match=message):
        KafkaSettings.from_mapping({"bootstrap.servers": "b:9092", **settings}, origin="connection 'k'").check()


def test_kafka_python_spellings_are_accepted_and_overrides_win():
    assert canonical_name("sasl_plain_username") == "sasl.username" and canonical_name("ssl_cafile") == "ssl.ca.location"
    assert canonical_name("sasl.mechanisms") == "sasl.mechanism"
    base = KafkaSettings.from_mapping({"bootstrap.servers": "a:1", "client.id": "x"}, origin="connection 'k'")
    merged = base.merged({"client_id": "y", "security_protocol": "SSL"})
    assert merged.properties == {"client.id": "y", "security.protocol": "SSL"} and merged.origin == "connection 'k'"
    assert KafkaSettings.from_mapping({}).bootstrap_servers == ""
    with pytest.raises(ConfigurationError, match="no Kafka bootstrap servers"):
        KafkaSettings.from_mapping({}).require_servers()


# What each client says when the settings are wrong, word for word (kafka-python, Java's client in Spark,
# librdkafka); tests/integration/test_kafka_security.py gets the same texts from a real secured broker.
REFUSED_LOGIN = [
    "SaslAuthenticationFailedError: Authentication failed during authentication due to invalid credentials",
    "Caused by: org.apache.kafka.common.errors.SaslAuthenticationException: Authentication failed during "
    "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512",
    "sasl_ssl://b1:9093/bootstrap: SASL authentication error: Authentication failed",
]
UNTRUSTED = [
    "Handshake failed: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer",
    "javax.net.ssl.SSLHandshakeException: PKIX path building failed: unable to find valid certification path",
]


@pytest.mark.parametrize("said", REFUSED_LOGIN)
def test_a_refused_login_names_the_credentials_and_where_they_came_from(said):
    error = explain_refusal(KafkaSettings.from_mapping(SCRAM, origin="connection 'kafka_secured'"), said)
    assert isinstance(error, ConfigurationError) and error.retriable is False
    assert "refused the SASL login of user 'app' (sasl.mechanism=SCRAM-SHA-512)" in str(error)
    assert "fix sasl.username and sasl.password (or sasl.jaas.config) in connection 'kafka_secured'" in str(error)


@pytest.mark.parametrize("said", UNTRUSTED)
def test_an_untrusted_certificate_names_the_ca_setting(said):
    error = explain_refusal(KafkaSettings.from_mapping(SCRAM, origin="connection 'k'"),
                            f"first line\n{said}\n\tat x.y(Z)")
    assert "ssl.ca.location=/etc/kafka/ca.pem in connection 'k'" in str(error)
    assert str(error).endswith(said.strip())  # the client's own line, not its stack


def test_a_certificate_for_another_host_is_told_apart_from_an_untrusted_one():
    said = "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: IP address mismatch, certificate is not valid"
    error = explain_refusal(KafkaSettings.from_mapping(SCRAM), said)
    assert "not issued for the host names in bootstrap.servers" in str(error)
    assert "ssl.endpoint.identification.algorithm" in str(error)


def test_denied_operations_name_the_grant():
    settings = KafkaSettings.from_mapping(SCRAM, origin="connection 'k'")
    txn = explain_refusal(settings, "TransactionalIdAuthorizationFailedError", transactional_id_prefix="orders")
    assert "do not let user 'app' of connection 'k' use its transactional ids" in str(txn)
    assert "--allow-principal User:app --operation Write --operation Describe --transactional-id orders" in str(txn)
    topic = explain_refusal(settings, "org.apache.kafka.common.errors.TopicAuthorizationException: Not authorized "
                            "to access topics: [in]", topics=["in"])
    assert "READ and DESCRIBE topic(s) in" in str(topic) and "--operation Read --operation Describe --topic in" \
        in str(topic)
    assert "DescribeConfigs" in str(explain_refusal(settings, "ClusterAuthorizationFailedError"))


def test_a_denied_read_of_a_topic_pattern_pipelines_write_names_the_pattern():
    """The write knows the pipeline's topic_pattern, not its topics: the hint names the pattern, not `<topic>`."""
    from airflow_exactly_once.spark.write_failures import explain_spark_failure
    from tests.harness import pipeline_config

    config = pipeline_config("p", [], {"type": "parquet", "path": "/tmp/unused"}, topic_pattern=r"orders\..*",
                             kafka_config=SCRAM)
    said = "org.apache.kafka.common.errors.TopicAuthorizationException: Not authorized to access topics: [orders.eu]"
    error = str(explain_spark_failure(RuntimeError(said), config))
    assert "READ and DESCRIBE the topics matching topic_pattern 'orders\\\\..*'" in error
    assert "--operation Read --operation Describe --topic <each matching topic>" in error
    assert "<topic>" not in error


def test_failures_that_are_no_settings_problem_are_left_to_the_caller():
    settings = KafkaSettings.from_mapping(SCRAM)
    assert explain_refusal(settings, "KafkaTimeoutError: Unable to bootstrap from b1:9093") is None
    assert explain_refusal(settings, ValueError("a transform bug")) is None


def test_spark_reads_a_range_without_the_brokers_fetch_wait_unless_kafka_config_sets_one():
    """Spark's Kafka reader waited fetch.max.wait.ms (500 ms) per partition of every batch; kafka_config still wins."""
    from airflow_exactly_once.core.model import Batch, OffsetRange
    from airflow_exactly_once.core.states import BatchState
    from airflow_exactly_once.spark.batch_read import kafka_read_options
    from tests.harness import pipeline_config

    batch = Batch("p", 1, "run", BatchState.PLANNED, 1, (OffsetRange("t", 0, 5, 9), OffsetRange("t", 1, 3, 3)))
    sink = {"type": "parquet", "path": "/tmp/unused"}
    options = kafka_read_options(batch, pipeline_config("p", ["t"], sink))
    assert options["kafka.fetch.max.wait.ms"] == "10"
    assert (options["assign"], options["startingOffsets"], options["endingOffsets"]) == (
        '{"t": [0]}', '{"t": {"0": 5}}', '{"t": {"0": 9}}')  # the empty range is not read
    mine = kafka_read_options(batch, pipeline_config("p", ["t"], sink, kafka_config={"fetch.max.wait.ms": 200}))
    assert mine["kafka.fetch.max.wait.ms"] == "200"


def test_a_pipelines_reads_share_one_group_id_that_changes_with_the_connection_but_never_shows_a_secret():
    """Spark pools its executors' consumers by group id and partition (spark.batch_read.reader_group)."""
    from airflow_exactly_once.core.model import Batch, OffsetRange
    from airflow_exactly_once.core.states import BatchState
    from airflow_exactly_once.spark.batch_read import kafka_read_options, reader_group
    from tests.harness import pipeline_config

    sink = {"type": "parquet", "path": "/tmp/unused"}
    first = Batch("p", 1, "run", BatchState.PLANNED, 1, (OffsetRange("t", 0, 5, 9),))
    second = Batch("p", 2, "run-2", BatchState.PLANNED, 1, (OffsetRange("t", 0, 9, 20),))
    group = kafka_read_options(first, pipeline_config("p", ["t"], sink))["kafka.group.id"]
    assert group.startswith("airflow-exactly-once-p-")
    assert kafka_read_options(second, pipeline_config("p", ["t"], sink))["kafka.group.id"] == group
    assert kafka_read_options(first, pipeline_config("q", ["t"], sink))["kafka.group.id"] != group
    assert kafka_read_options(first, pipeline_config("p", ["t"], sink, bootstrap="other:9092"))[
        "kafka.group.id"] != group

    scram = KafkaSettings.from_mapping(SCRAM)
    other_user = KafkaSettings.from_mapping({**SCRAM, "sasl.username": "app2"})
    other_password = KafkaSettings.from_mapping({**SCRAM, "sasl.password": "rotated"})
    assert reader_group(scram, "p") != reader_group(other_user, "p")
    assert reader_group(scram, "p") == reader_group(other_password, "p")  # the digest never covers a secret
