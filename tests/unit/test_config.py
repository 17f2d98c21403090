"""Pipeline settings: validation, the guarantee's new home, secrets kept out of the ledger."""

from __future__ import annotations

import pytest

from airflow_exactly_once.core.config import PipelineConfig, resolve_transform
from airflow_exactly_once.core.config_checks import validate_config
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.pipeline_check import checked
from airflow_exactly_once.sinks.parquet.sink_committer import ParquetSinkCommitter
from tests.harness import pipeline_config


def config(**overrides) -> PipelineConfig:
    values = dict(pipeline_id="p", topics=["t"], sink={"type": "parquet", "path": "/tmp/x"},
                  bootstrap_servers="127.0.0.1:9092")
    values.update(overrides)
    return checked(PipelineConfig(**values))


@pytest.mark.parametrize("overrides, message", [
    ({"pipeline_id": "has space"}, "pipeline_id"),
    ({"topics": []}, "topics"),
    ({"bootstrap_servers": ""}, "bootstrap"),
    ({"startup_mode": "beginning"}, "startup_mode"),
    ({"max_records_per_partition": 0}, "max_records_per_partition"),
    ({"local_read_max_records": -1}, "local_read_max_records=-1: give a whole number"),
    ({"local_read_max_records": "many"}, "local_read_max_records='many'"),
    ({"local_read_max_records": 2.5}, "local_read_max_records=2.5"),
    ({"sink": {"path": "/x"}}, "sink must be a dict with a 'type'"),
    ({"guarantee": "MAYBE"}, "guarantee='MAYBE' is not supported"),
    ({"kafka_config": {"group.id": "g"}}, "must not set group.id"),
])
def test_bad_configuration_names_the_setting(overrides, message):
    with pytest.raises(ConfigurationError, match=message):
        config(**overrides)


def test_local_read_max_records_takes_a_rendered_template_and_zero():
    assert config(local_read_max_records="250").local_read_max_records == 250  # a Jinja field renders a string
    assert config(local_read_max_records=0).local_read_max_records == 0
    assert config().local_read_max_records == 50_000
    assert config(local_read_max_records=0).fingerprint() == config().fingerprint()  # how, not what, it reads


def test_guarantee_moves_into_the_sink_spec_and_the_old_spelling_keeps_working():
    old = config(sink={"type": "kafka", "topic": "out"}, guarantee="AT_LEAST_ONCE")
    assert old.sink == {"type": "kafka", "topic": "out", "guarantee": "AT_LEAST_ONCE"} and old.guarantee is None
    new = config(sink={"type": "kafka", "topic": "out", "guarantee": "AT_LEAST_ONCE"})
    assert new.fingerprint() == old.fingerprint()
    # The default is not written into the spec: existing pipelines keep their fingerprint.
    assert config(sink={"type": "kafka", "topic": "out"}, guarantee="EXACTLY_ONCE").sink == {"type": "kafka",
                                                                                            "topic": "out"}
    with pytest.raises(ConfigurationError, match="contradicts"):
        config(sink={"type": "kafka", "topic": "out", "guarantee": "NONE"}, guarantee="AT_LEAST_ONCE")


def test_secrets_stay_out_of_the_ledger_and_travel_separately():
    cfg = config(kafka_config={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                               "sasl.username": "app", "sasl.password": "s3cr3t", "ssl.ca.location": "/ca.pem"},
                 sink={"type": "kafka", "topic": "out", "kafka_config": {"sasl_plain_password": "other"}})
    stored = cfg.to_stored_dict()
    assert "s3cr3t" not in repr(stored) and "other" not in repr(stored)
    assert stored["kafka_config"]["sasl.username"] == "app"
    restored = PipelineConfig.from_dict(stored).with_secrets(cfg.secrets())
    assert restored.kafka_config == cfg.kafka_config and restored.sink == cfg.sink
    assert PipelineConfig.from_dict({**stored, "a_field_of_a_later_release": 1}).pipeline_id == "p"


def test_a_kafka_dead_letter_destinations_secrets_stay_out_of_the_ledger_too():
    cfg = config(bad_record_policy="dead_letter",
                 dead_letter={"type": "kafka", "topic": "dlq", "kafka_config": {"sasl.password": "dlq-s3cr3t"}})
    assert ["dead_letter", "kafka_config", "sasl.password"] in cfg.secret_paths
    stored = cfg.to_stored_dict()
    assert "dlq-s3cr3t" not in repr(stored) and stored["dead_letter"]["topic"] == "dlq"
    assert PipelineConfig.from_dict(stored).with_secrets(cfg.secrets()).dead_letter == cfg.dead_letter


def test_a_config_whose_secrets_were_not_looked_for_is_never_stored():
    unchecked = validate_config(PipelineConfig(pipeline_id="p", topics=["t"],
                                               sink={"type": "kafka", "topic": "out",
                                                     "kafka_config": {"sasl.password": "s3cr3t"}},
                                               bootstrap_servers="127.0.0.1:9092"))
    with pytest.raises(RuntimeError, match="secrets are not known"):
        unchecked.to_stored_dict()


def test_transform_references():
    assert resolve_transform("json:dumps")([1]) == "[1]"
    with pytest.raises(ConfigurationError, match="cannot be imported"):
        resolve_transform("no_such_module_xyz:f")
    with pytest.raises(ConfigurationError, match="has no function"):
        resolve_transform("json:no_such_function")
    with pytest.raises(ConfigurationError, match="must look like"):
        resolve_transform("json.dumps")


def test_parquet_sink_rejects_unsafe_paths():
    with pytest.raises(ConfigurationError, match="absolute"):
        ParquetSinkCommitter({"type": "parquet", "path": "relative/out"})
    with pytest.raises(ConfigurationError, match="atomic rename"):
        ParquetSinkCommitter({"type": "parquet", "path": "s3a://bucket/out"})


def test_a_staged_sink_implements_exactly_once_only():
    from airflow_exactly_once.sinks import create_committer, create_writer

    cfg = pipeline_config("p", ["t"], {"type": "parquet", "path": "/tmp/never"}, guarantee="NONE")
    for create in (create_committer, create_writer):  # refused as either side is built from the spec
        with pytest.raises(ConfigurationError, match="parquet sink does not implement guarantee='NONE'"):
            create(cfg.sink)


@pytest.mark.parametrize("spec, wrong", [
    ({"type": "parquet", "path": "/tmp/out", "partiton_by": ["day"]}, "'partiton_by'"),
    ({"type": "postgres", "url": "postgresql://db/x", "table": "t", "key_colums": ["id"]},
     "'key_colums' (did you mean 'key_columns'?)"),
])
def test_a_mistyped_sink_setting_is_an_error_naming_it(spec, wrong):
    """Issue 24: no sink ignores a key it does not know (the Parquet and PostgreSQL sinks did)."""
    from airflow_exactly_once.sinks import create_committer

    with pytest.raises(ConfigurationError, match="has no setting") as refused:
        create_committer(spec)
    assert wrong in str(refused.value) and f"the {spec['type']} sink" in str(refused.value)
