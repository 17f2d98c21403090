"""No secret at rest or on screen (invariant 9): the rules that find secrets from the declarations, what the
ledger stores in their place, how a write gets them back, and that errors, events and logs never show them."""

from __future__ import annotations

import pytest
from airflow.sdk._shared.secrets_masker import redact

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import OffsetRange
from airflow_exactly_once.core.secrets import (REDACTED, SECRET_KEY_PATTERN, redacted_value, scrub, shown_url,
                                              url_password, widened_options_redaction)
from airflow_exactly_once.operators import arguments
from airflow_exactly_once.operators.batch import PlanBatchOperator
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks.iceberg.catalog import CatalogSpec


def config(**overrides) -> PipelineConfig:
    values = dict(pipeline_id="p", topics=["t"], sink={"type": "parquet", "path": "/tmp/x"},
                  bootstrap_servers="127.0.0.1:9092")
    values.update(overrides)
    return checked(PipelineConfig(**values))


# Each sink type's spec with a secret in every place its declaration names one, and what stays readable.
SPECS_WITH_SECRETS = {
    "postgres url": ({"type": "postgres", "url": "postgresql://app:pg-s3cr3t@db:5432/shop", "table": "orders"},
                     ["pg-s3cr3t"], lambda s: s["url"] == "postgresql://app:***@db:5432/shop"),
    "kafka kafka_config": ({"type": "kafka", "topic": "out", "kafka_config": {"sasl.username": "app",
                                                                               "sasl.password": "kafka-s3cr3t"}},
                           ["kafka-s3cr3t"], lambda s: s["kafka_config"]["sasl.username"] == "app"),
    "iceberg catalog": ({"type": "iceberg", "table": "db.orders", "warehouse": "s3://lake/wh",
                         "catalog": {"type": "postgres", "url": "postgresql://cat:cat-s3cr3t@db/cat",
                                     "properties": {"s3.endpoint": "http://minio:9000",
                                                    "s3.secret-access-key": "s3-s3cr3t", "credential": "cred-s3cr3t",
                                                    "token": "tok-s3cr3t"}}},
                        ["cat-s3cr3t", "s3-s3cr3t", "cred-s3cr3t", "tok-s3cr3t"],
                        lambda s: s["catalog"]["properties"]["s3.endpoint"] == "http://minio:9000"
                        and s["catalog"]["url"] == "postgresql://cat:***@db/cat"),
    # No declaration names it: a URL with a password is a secret wherever it is.
    "parquet path with user info": ({"type": "parquet", "path": "s3a://AKID:parquet-s3cr3t@bucket/out"},
                                    ["parquet-s3cr3t"], lambda s: s["path"] == "s3a://AKID:***@bucket/out"),
}


@pytest.mark.parametrize("spec, secrets, readable", SPECS_WITH_SECRETS.values(), ids=SPECS_WITH_SECRETS.keys())
def test_every_sinks_declared_secrets_stay_out_of_the_stored_config_and_come_back_for_a_write(spec, secrets, readable):
    cfg = config(sink=spec)
    stored = cfg.to_stored_dict()
    assert not [s for s in secrets if s in repr(stored)] and readable(stored["sink"])
    assert PipelineConfig.from_dict(stored).with_secrets(cfg.secrets()).sink == cfg.sink
    assert set(secrets) <= set(cfg.secret_texts())


@pytest.mark.parametrize("dead_letter, secret", [
    ({"type": "postgres", "url": "postgresql://app:dlq-pg-s3cr3t@db/shop", "table": "dlq"}, "dlq-pg-s3cr3t"),
    ({"type": "kafka", "topic": "dlq", "kafka_config": {"sasl.jaas.config": "x password=\"dlq-jaas\";"}}, "dlq-jaas"),
])
def test_a_dead_letter_destinations_secrets_stay_out_too(dead_letter, secret):
    cfg = config(bad_record_policy="dead_letter", dead_letter=dead_letter)
    stored = cfg.to_stored_dict()
    assert secret not in repr(stored) and stored["dead_letter"]["type"] == dead_letter["type"]
    assert PipelineConfig.from_dict(stored).with_secrets(cfg.secrets()).dead_letter == cfg.dead_letter


def test_a_stored_config_round_trips_and_a_stored_one_has_nothing_left_to_ship():
    cfg = config(sink=SPECS_WITH_SECRETS["postgres url"][0], kafka_config={"sasl.password": "src-s3cr3t"})
    again = PipelineConfig.from_dict(cfg.to_stored_dict())
    assert again.to_stored_dict() == cfg.to_stored_dict() and again.secrets() == []
    assert again.with_secrets(cfg.secrets()).to_dict() == cfg.to_dict()


def test_urls_keep_all_but_their_password_or_token():
    assert redacted_value("postgresql+psycopg2://u:p%40ss@h:5432/d") == "postgresql+psycopg2://u:***@h:5432/d"
    assert redacted_value("sc://h:15002/;user_id=a;token=tk1") == "sc://h:15002/;user_id=a;token=***"
    assert redacted_value("plain-secret") == REDACTED
    # What messages show of a URL: a registry's address stays readable, a password in it does not.
    assert shown_url("https://registry:8081") == "https://registry:8081"
    assert shown_url("https://u:pw@registry:8081") == "https://u:***@registry:8081"
    assert url_password("postgresql://u@h/d") is None and url_password("http://h:8080/x") is None
    text = 'connect to postgresql://u:pw1@h/d failed; sc://h/;token=tk2; "sasl.password": "given"'
    assert scrub(text, ["given"]) == 'connect to postgresql://u:***@h/d failed; sc://h/;token=***; ' \
                                     '"sasl.password": "***"'


def test_spark_conf_the_ledger_url_and_a_spark_connect_token_are_secrets_of_the_arguments():
    values = {a.name: a.default for a in arguments.ARGUMENTS}
    values.update(sink={"type": "parquet", "path": "/x"}, ledger_url="postgresql://eo:ledger-s3cr3t@db/ledger",
                  spark_conf={"spark.hadoop.fs.s3a.secret.key": "s3a-s3cr3t", "spark.hadoop.fs.s3a.access.key": "AK1",
                              "spark.remote": "sc://h:15002/;token=connect-tok", "spark.executor.memory": "1g"},
                  kafka_config="{{ var.json.kafka }}")  # a template: looked at again once rendered
    found = arguments.secret_texts(values)
    assert {"ledger-s3cr3t", "s3a-s3cr3t", "AK1", "connect-tok"} <= set(found) and "1g" not in found


def test_operators_mask_literal_and_rendered_secrets_before_airflow_stores_rendered_fields(tmp_path):
    op = PlanBatchOperator(task_id="plan", pipeline_id="p", topics="t", bootstrap_servers="127.0.0.1:9",
                           ledger_url=f"sqlite:///{tmp_path / 'l.db'}",
                           sink={"type": "postgres", "url": "postgresql://app:{{ params.pw }}@db/shop", "table": "o"},
                           kafka_config={"sasl.password": "literal-s3cr3t"})
    assert redact("log line literal-s3cr3t") == "log line ***"
    op.render_template_fields({"params": {"pw": "rendered-s3cr3t"}})
    assert op.sink["url"] == "postgresql://app:rendered-s3cr3t@db/shop"  # the task writes with it ...
    assert "rendered-s3cr3t" not in repr(redact(op.sink, "sink"))  # ... what Airflow stores does not hold it


def test_the_ledger_keeps_secrets_out_of_errors_events_and_details(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    ledger.create_schema()
    ledger.hide(["sasl-s3cr3t"])
    ledger.ensure_pipeline("p", "f", {})
    batch = ledger.create_batch("p", "run", [OffsetRange("t", 0, 0, 5)], expected_epoch=0)
    ledger.update_details(batch.id, write_error={"message": "auth failed for sasl-s3cr3t"})
    ledger.mark_aborted(batch.id, "cannot reach postgresql://app:url-s3cr3t@db/shop (sasl-s3cr3t)")
    ledger.record_event("p", None, "mirror-failed", "sasl-s3cr3t rejected")
    stored = repr(ledger.get_batch(batch.id)) + repr(ledger.list_events("p"))
    assert "s3cr3t" not in stored and "postgresql://app:***@db/shop" in stored


def test_iceberg_catalog_properties_reach_pyiceberg_and_spark_alike():
    catalog = CatalogSpec.from_spec({"table": "db.t", "warehouse": "s3://lake/wh",
                                     "catalog": {"type": "postgres", "url": "postgresql://u@db/cat",
                                                 "properties": {"s3.endpoint": "http://minio:9000"}}})
    assert catalog.spark_conf()["spark.sql.catalog.iceberg.s3.endpoint"] == "http://minio:9000"
    assert dict(catalog.properties) == {"s3.endpoint": "http://minio:9000"}


def test_sparks_options_redaction_is_widened_to_every_secret_key_once():
    """Spark's default "(?i)url" keeps redacting URLs and now also takes a catalog's credential and Authorization
    header; a pattern that has the rule already (a second catalog in the same session) is left alone."""
    import re

    widened = widened_options_redaction(None)
    assert widened == f"(?i)url|{SECRET_KEY_PATTERN}"
    for key in ("spark.sql.catalog.c.credential", "spark.sql.catalog.c.header.Authorization", "jdbc.url",
                "spark.sql.catalog.c.s3.secret-access-key", "spark.sql.catalog.c.token"):
        assert re.search(widened.replace("(?i)", ""), key, re.I), key  # Java takes the inline flags; Python not
    assert not re.search(widened.replace("(?i)", ""), "spark.sql.catalog.c.uri", re.I)
    assert widened_options_redaction(widened) is None
    assert widened_options_redaction("(?i)mine") == f"(?i)mine|{SECRET_KEY_PATTERN}"
