"""OAUTHBEARER (OIDC client credentials) in the kafka connection's settings: each client's words, and the token cache.

The token tests ask devtools' OIDC provider (a thread on 127.0.0.1), the same one the secured broker trusts in
tests/integration/test_kafka_oauth.py.
"""

from __future__ import annotations

import jwt
import pytest
from kafka import KafkaAdminClient, KafkaConsumer

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.kafka.oauth import ClientCredentials, access_token
from airflow_exactly_once.kafka.access import OAUTH_ALLOWED_URLS_PROPERTY, explain_refusal
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.spark.batch_read import reader_group
from airflow_exactly_once.spark.packages import JOSE4J_PACKAGE, pipeline_packages
from devtools.oauth_provider import LocalOAuthProvider

ORIGIN = "connection 'kafka_oauth'"
OIDC = {"bootstrap.servers": "b1:9094", "security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "app",
        "sasl.oauthbearer.client.secret": 's3"cr\\et', "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
        "sasl.oauthbearer.scope": "kafka", "ssl.ca.location": "/etc/kafka/ca.pem"}


@pytest.fixture(scope="module")
def provider():
    with LocalOAuthProvider({"app": "app-secret"}, token_lifetime_s=600) as started:
        yield started


def test_java_gets_the_login_module_the_token_handler_and_the_endpoint():
    java = KafkaSettings.from_mapping(OIDC, origin=ORIGIN).check().java()
    assert java["sasl.jaas.config"] == ('org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
                                        'clientId="app" clientSecret="s3\\"cr\\\\et" scope="kafka";')
    assert java["sasl.login.callback.handler.class"] == \
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
    assert java["sasl.oauthbearer.token.endpoint.url"] == "https://idp/token"
    assert java["sasl.mechanism"] == "OAUTHBEARER"
    # librdkafka's names of the client's settings would only make Java's client warn about unknown configs
    assert not any(k.startswith(("sasl.oauthbearer.client", "sasl.oauthbearer.scope", "sasl.oauthbearer.method"))
                   for k in java)


def test_sasl_extensions_reach_every_client(provider):
    settings = KafkaSettings.from_mapping({**OIDC, "sasl.oauthbearer.extensions": "logicalCluster=lkc-1, pool=p",
                                           "sasl.oauthbearer.client.secret": "app-secret",
                                           "sasl.oauthbearer.token.endpoint.url": provider.token_url})
    assert settings.java()["sasl.jaas.config"].endswith(' extension_logicalCluster="lkc-1" extension_pool="p";')
    assert "sasl.oauthbearer.extensions" not in settings.java()
    assert settings.kafka_python(KafkaConsumer)["sasl_oauth_token_provider"].extensions() == {
        "logicalCluster": "lkc-1", "pool": "p"}
    assert settings.librdkafka()["sasl.oauthbearer.extensions"] == "logicalCluster=lkc-1, pool=p"


def test_librdkafka_gets_its_oidc_method_and_no_username():
    props = KafkaSettings.from_mapping({k: v for k, v in OIDC.items() if k != "sasl.oauthbearer.method"}).librdkafka()
    assert props["sasl.oauthbearer.method"] == "oidc" and props["sasl.oauthbearer.client.secret"] == 's3"cr\\et'
    assert props["sasl.oauthbearer.token.endpoint.url"] == "https://idp/token"
    assert props["sasl.oauthbearer.scope"] == "kafka"
    assert "sasl.username" not in props and "sasl.password" not in props
    assert "sasl.jaas.config" not in props and "sasl.login.callback.handler.class" not in props


def test_a_java_style_jaas_config_serves_every_client():
    settings = KafkaSettings.from_mapping({
        "bootstrap.servers": "b:9094", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
        "sasl.jaas.config": 'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
                            'clientId="j" clientSecret="js" scope="s";'}).check()
    assert settings.oauth_client() == ClientCredentials("https://idp/token", "j", "js", "s", "kafka_config")
    assert settings.librdkafka()["sasl.oauthbearer.client.id"] == "j" and settings.principal == "OAuth client 'j'"


@pytest.mark.parametrize("change, message", [
    ({"sasl.oauthbearer.client.secret": None},
     r"set sasl.oauthbearer.client.secret \(with sasl.oauthbearer.method=oidc"),
    ({"sasl.oauthbearer.token.endpoint.url": None, "sasl.oauthbearer.client.id": None},
     "set sasl.oauthbearer.client.id, sasl.oauthbearer.token.endpoint.url"),
    ({"sasl.oauthbearer.method": "default"}, "only OIDC client credentials are supported"),
])
def test_oauth_settings_no_client_can_use_are_refused_with_the_fix(change, message):
    with pytest.raises(ConfigurationError, match=message) as caught:
        KafkaSettings.from_mapping({**OIDC, **change}, origin=ORIGIN).check()
    assert ORIGIN in str(caught.value) and not caught.value.retriable


def test_kafka_python_gets_a_token_provider_whose_token_is_fetched_once(provider):
    settings = KafkaSettings.from_mapping({**OIDC, "sasl.oauthbearer.client.secret": "app-secret",
                                           "sasl.oauthbearer.token.endpoint.url": provider.token_url,
                                           "sasl.oauthbearer.scope": "unit-cache"})
    before = provider.token_requests
    consumer = settings.kafka_python(KafkaConsumer)
    admin = settings.kafka_python(KafkaAdminClient)
    assert consumer["sasl_mechanism"] == "OAUTHBEARER" and "sasl_plain_password" not in consumer
    token = consumer["sasl_oauth_token_provider"].token()
    assert admin["sasl_oauth_token_provider"].token() == token
    assert provider.token_requests == before + 1  # one grant for every client of the process, until it expires
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["sub"] == "app" and claims["scope"] == "unit-cache"
    assert "app-secret" not in repr(consumer["sasl_oauth_token_provider"])


def test_a_changed_secret_is_not_served_the_old_secrets_token(provider):
    good = ClientCredentials(provider.token_url, "app", "app-secret", "unit-rotation")
    assert access_token(good)
    with pytest.raises(ConfigurationError, match="refused the client credentials of client 'app'"):
        access_token(ClientCredentials(provider.token_url, "app", "rotated", "unit-rotation"))


def test_what_clients_say_about_tokens_is_explained_with_the_fix():
    settings = KafkaSettings.from_mapping(OIDC, origin=ORIGIN)
    fetch = explain_refusal(settings, "KafkaError{code=_AUTHENTICATION,val=-169,str=\"Failed to acquire SASL "
                            "OAUTHBEARER token: HTTP 401\"}")
    assert fetch is not None and "could not get an OAuth token for client 'app' from the token endpoint " \
        "https://idp/token" in str(fetch)
    assert "fix sasl.oauthbearer.client.id and sasl.oauthbearer.client.secret" in str(fetch)
    allowed = explain_refusal(settings, "ConfigException: The URL https://idp/token is not allowed; set the system "
                              f"property {OAUTH_ALLOWED_URLS_PROPERTY} to allow it")
    assert allowed is not None
    assert f"-D{OAUTH_ALLOWED_URLS_PROPERTY}=https://idp/token to spark.driver.extraJavaOptions" in str(allowed)
    refused = explain_refusal(settings, "SaslAuthenticationException: {\"status\":\"invalid_token\"}")
    assert refused is not None and "refused the OAuth token of OAuth client 'app'" in str(refused)
    denied = explain_refusal(settings, "TopicAuthorizationFailedError", topics=["t"])
    assert denied is not None and "--allow-principal User:app" in str(denied)


def test_the_client_secret_is_never_stored_nor_in_the_reader_group():
    config = checked(PipelineConfig(pipeline_id="p", topics=["t"], sink={"type": "parquet", "path": "/tmp/x"},
                                    bootstrap_servers="b1:9094", kafka_config={k: v for k, v in OIDC.items()
                                                                               if k != "bootstrap.servers"}))
    stored = config.to_stored_dict()["kafka_config"]
    assert stored["sasl.oauthbearer.client.secret"] == "***" and stored["sasl.oauthbearer.client.id"] == "app"
    settings = KafkaSettings.of(config)
    group = reader_group(settings, "p")
    other = reader_group(KafkaSettings.from_mapping({**OIDC, "sasl.oauthbearer.client.id": "other"}), "p")
    assert group != other and group == reader_group(
        KafkaSettings.from_mapping({**OIDC, "sasl.oauthbearer.client.secret": "x"}), "p")
    assert JOSE4J_PACKAGE in pipeline_packages(config)
    plain = PipelineConfig(pipeline_id="p", topics=["t"], sink={"type": "parquet", "path": "/tmp/x"},
                           bootstrap_servers="b1:9094")
    assert JOSE4J_PACKAGE not in pipeline_packages(plain)
