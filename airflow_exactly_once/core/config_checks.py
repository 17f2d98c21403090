"""The protocol's checks of a pipeline's settings: what each value of a `PipelineConfig` may be.

core.config declares the settings (and serialises them); what values they may take, and how a given
value is brought into its stored form (a topic name into a list, a timestamp into epoch ms, a schema
into its JSON or DDL), is its own concern, kept here as functions of the config. What Kafka's clients,
a value schema and each sink accept is checked by pipeline_check, which calls `validate_config` first.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from airflow_exactly_once.core.config import (
    BAD_RECORD_POLICIES,
    DATA_LOSS_POLICIES,
    GUARANTEES,
    INTERVAL_RERUNS,
    KEY_FORMATS,
    NEW_PARTITION_STARTS,
    RANGE_MODES,
    REGISTRY_FORMATS,
    STARTUP_MODES,
    VALUE_FORMATS,
    PipelineConfig,
)
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.timestamps import to_epoch_ms
from airflow_exactly_once.core.topics import compile_topic_pattern, matching_topics

_PIPELINE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


def validate_config(config: PipelineConfig) -> PipelineConfig:
    """`config` checked against the protocol's rules, each value brought into its stored form (in place);
    raises ConfigurationError naming what to fix."""
    if not _PIPELINE_ID.match(config.pipeline_id or ""):
        raise ConfigurationError(
            f"pipeline_id {config.pipeline_id!r} is not valid: use letters, digits, '_', '.', '-' "
            "(it names transactions, folders and ledger rows)")
    _validate_topics(config)
    for name, value, allowed in (("startup_mode", config.startup_mode, STARTUP_MODES),
                                 ("new_partition_start", config.new_partition_start, NEW_PARTITION_STARTS),
                                 ("startup_fallback", config.startup_fallback, NEW_PARTITION_STARTS),
                                 ("data_loss_policy", config.data_loss_policy, DATA_LOSS_POLICIES),
                                 ("range_mode", config.range_mode, RANGE_MODES),
                                 ("bad_record_policy", config.bad_record_policy, BAD_RECORD_POLICIES),
                                 ("interval_rerun", config.interval_rerun, INTERVAL_RERUNS)):
        if value not in allowed:
            raise ConfigurationError(f"{name}={value!r} is not supported; choose one of {', '.join(allowed)}")
    _validate_startup(config)
    if config.max_records_per_partition is not None and int(config.max_records_per_partition) <= 0:
        raise ConfigurationError("max_records_per_partition must be a positive number (or None for no bound)")
    _validate_local_read(config)
    _validate_retention(config)
    if not isinstance(config.sink, dict) or "type" not in config.sink:
        raise ConfigurationError("sink must be a dict with a 'type', e.g. {'type': 'parquet', 'path': '/data/out'}")
    _fold_guarantee(config)
    _validate_decoding(config)
    if config.mirror_consumer_group is not None and not (isinstance(config.mirror_consumer_group, str)
                                                         and config.mirror_consumer_group.strip()):
        raise ConfigurationError("mirror_consumer_group must be a consumer group id (a non-empty string), "
                                 "or None to leave consumer groups alone")
    if config.transform is not None and not isinstance(config.transform, str):
        raise ConfigurationError("transform in a PipelineConfig must be a 'module:function' string")
    return config


def _validate_topics(config: PipelineConfig) -> None:
    """Exactly one of `topics` (names) and `topic_pattern` (a regular expression over names)."""
    if isinstance(config.topics, str):
        config.topics = [config.topics]
    config.topics = list(config.topics or [])
    if config.topic_pattern in ("", None):
        config.topic_pattern = None
        if not config.topics or not all(isinstance(t, str) and t for t in config.topics):
            raise ConfigurationError("give the Kafka topics to read: topics='orders' (a name or a list of names), "
                                     "or topic_pattern='orders\\\\..*' (every topic whose whole name matches)")
        return
    if config.topics:
        raise ConfigurationError(f"give either topics or topic_pattern, not both (topics={config.topics}, "
                                 f"topic_pattern={config.topic_pattern!r}): a pattern already names every topic "
                                 "the pipeline reads; put the listed names into the pattern, or drop it")
    compile_topic_pattern(config.topic_pattern)
    if config.range_mode == "interval":
        raise ConfigurationError("topic_pattern does not apply to range_mode='interval' yet: an interval's "
                                 "boundaries are fixed per partition the first time it runs, so a topic found "
                                 "later would be missing from intervals already fixed; list the topics "
                                 "(topics=[...]) or use range_mode='continuation'")


def _validate_local_read(config: PipelineConfig) -> None:
    value = config.local_read_max_records
    number = _number(value, int)
    if number is None or number < 0:
        raise ConfigurationError(f"local_read_max_records={value!r}: give a whole number of offsets, e.g. 50000 "
                                 "(0 reads every batch with Spark's Kafka source)")
    config.local_read_max_records = number


def _validate_retention(config: PipelineConfig) -> None:
    """Whole numbers of batches (at least 1: the newest committed batch always stays), days above 0."""
    for name, kind in (("retention_batches", int), ("retention_days", float)):
        value = getattr(config, name)
        if value is None:
            continue
        number = _number(value, kind)
        if number is None or number <= 0:
            example = "1000" if kind is int else "7 (or 0.5 for twelve hours)"
            raise ConfigurationError(f"{name}={value!r}: give a number above 0, e.g. {example}, or None to "
                                     "not bound retention by it (None for both keeps every batch)")
        setattr(config, name, number if kind is int or number != int(number) else int(number))


def _validate_registry(config: PipelineConfig) -> None:
    """Registry formats need the registry; their reader schema is a version, a schema, or the latest."""
    if config.key_format is not None and config.key_format not in KEY_FORMATS:
        raise ConfigurationError(f"key_format={config.key_format!r} is not supported; choose one of "
                                 f"{', '.join(KEY_FORMATS)}, or None to leave the key bytes")
    for part in ("value", "key"):
        fmt, schema = getattr(config, f"{part}_format"), getattr(config, f"{part}_schema")
        if not config.uses_registry(part):
            if part == "key" and schema is not None:
                raise ConfigurationError("key_schema is only used with key_format avro, protobuf or json_schema")
            if getattr(config, f"{part}_subject") is not None:
                raise ConfigurationError(f"{part}_subject is only used with {part}_format avro, protobuf or "
                                         "json_schema read through a Schema Registry (schema_registry_conn_id)")
            continue
        if not (config.schema_registry or config.schema_registry_conn_id):
            raise ConfigurationError(f"{part}_format={fmt!r} reads the Schema Registry wire format: give "
                                     "schema_registry_conn_id='<a schema_registry connection>' (its URL and "
                                     "credentials)")
        if config.topic_pattern is not None and not getattr(config, f"{part}_subject"):
            raise ConfigurationError(f"{part}_format={fmt!r} with topic_pattern needs {part}_subject='<subject>': "
                                     f"the default subject is '<topic>-{part}' per topic, and the topics a "
                                     "pattern will match are not known when the batch's reader schema is fixed")
        if isinstance(schema, bool) or (isinstance(schema, (int, float)) and int(schema) != schema):
            raise ConfigurationError(f"{part}_schema={schema!r}: give a version number, the schema, or None for "
                                     "the subject's latest version")
        if isinstance(schema, dict):
            setattr(config, f"{part}_schema", json.dumps(schema))


def _validate_decoding(config: PipelineConfig) -> None:
    """value_format needs its schema; bad-record settings must make sense together."""
    if config.value_format is not None and config.value_format not in VALUE_FORMATS:
        raise ConfigurationError(f"value_format={config.value_format!r} is not supported; choose one of "
                                 f"{', '.join(VALUE_FORMATS)}, or None for Kafka's raw columns")
    _validate_registry(config)
    if config.value_format in ("protobuf", "json_schema") or config.uses_registry("value"):
        pass  # the registry's schemas, checked by _validate_registry
    elif config.value_format in ("json", "avro") and not config.value_schema:
        example = "'id BIGINT, name STRING'" if config.value_format == "json" else "an Avro record schema (JSON)"
        raise ConfigurationError(f"value_format={config.value_format!r} needs value_schema, e.g. {example}: a value "
                                 "that does not decode under it is a bad record")
    if config.value_schema is not None and config.value_format not in ("json", *REGISTRY_FORMATS):
        raise ConfigurationError("value_schema is only used with value_format json, avro, protobuf or "
                                 "json_schema")
    if config.value_format == "avro" and isinstance(config.value_schema, dict):
        config.value_schema = json.dumps(config.value_schema)  # stored as the JSON Spark's from_avro takes
    if config.value_schema is not None and not isinstance(config.value_schema, (str, int)):
        config.value_schema = config.value_schema.simpleString() if hasattr(config.value_schema, "simpleString") \
            else str(config.value_schema)  # a StructType is stored as its DDL
    if config.dead_letter is not None and config.bad_record_policy != "dead_letter":
        raise ConfigurationError("dead_letter is only used with bad_record_policy='dead_letter'")
    if config.dead_letter is not None and (not isinstance(config.dead_letter, dict) or "type" not in config.dead_letter):
        raise ConfigurationError("dead_letter must be a sink spec with a 'type', e.g. {'type': 'kafka', "
                                 "'topic': 'orders_dlq'}")
    limit = config.max_bad_records
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 0
                              or (isinstance(limit, float) and limit >= 1)):
        raise ConfigurationError(f"max_bad_records={limit!r}: give a count (an int >= 0) or a fraction "
                                 "(a float below 1, e.g. 0.01 for 1%)")


def _fold_guarantee(config: PipelineConfig) -> None:
    """`guarantee=` is the old spelling of the sink's own setting: move it into the sink spec.

    Only the Kafka sink has more than one guarantee, so it belongs to the sink; the default
    (EXACTLY_ONCE) is not written into the spec, so existing pipelines keep their fingerprint.
    """
    if config.guarantee is None:
        return
    if config.guarantee not in GUARANTEES:
        raise ConfigurationError(f"guarantee={config.guarantee!r} is not supported; choose one of "
                                 f"{', '.join(GUARANTEES)}")
    given = config.sink.get("guarantee")
    if given is not None and given != config.guarantee:
        raise ConfigurationError(f"guarantee={config.guarantee!r} contradicts the sink's guarantee={given!r}; "
                                 "give it once, in the sink spec")
    if given is None and config.guarantee != "EXACTLY_ONCE":
        config.sink = {**config.sink, "guarantee": config.guarantee}
    config.guarantee = None


def _validate_startup(config: PipelineConfig) -> None:
    """Check the startup mode's own argument and bring it into its stored form."""
    if config.startup_mode == "timestamp":
        config.startup_timestamp = to_epoch_ms(config.startup_timestamp, "startup_timestamp (startup_mode='timestamp')")
    elif config.startup_timestamp not in (None, ""):
        raise ConfigurationError("startup_timestamp is only used with startup_mode='timestamp'; remove it or "
                                 "set startup_mode='timestamp'")
    if config.startup_mode == "specific_offsets":
        config.startup_offsets = normalize_offsets(config.startup_offsets, config.topics, config.topic_pattern)
    elif config.startup_offsets:
        raise ConfigurationError("startup_offsets is only used with startup_mode='specific_offsets'")
    if config.startup_mode == "group_offsets" and not config.startup_group_id:
        raise ConfigurationError("startup_mode='group_offsets' needs startup_group_id='<consumer group>' (the "
                                 "group whose committed offsets say where to start)")
    if config.range_mode == "interval":
        if config.max_records_per_partition is not None:
            raise ConfigurationError("max_records_per_partition does not apply to range_mode='interval': each "
                                     "run reads exactly its data interval; remove it or use a shorter schedule")
        if config.startup_mode != "earliest":
            raise ConfigurationError(f"startup_mode={config.startup_mode!r} does not apply to range_mode='interval':"
                                     " each run starts at the first record of its data interval; remove it")


# A whole number or a real one, as a setting asks for (`_number`).
Number = TypeVar("Number", int, float)


def _number(value: Any, kind: type[Number]) -> Number | None:
    """`value` (a number, or a rendered template's text) as `kind`; None when it is not one (a whole one for int)."""
    if isinstance(value, bool):
        return None
    try:
        number = kind(value)
        return None if kind is int and float(value) != number else number
    except (TypeError, ValueError):
        return None


def normalize_offsets(offsets: Any, topics: list[str], pattern: str | None = None) -> dict[str, int]:
    """{"topic:partition": offset} from {"topic": {partition: offset}} or {"topic:partition": offset}; each topic
    one of `topics`, or one `pattern` matches."""
    example = "{'orders': {0: 42, 1: 17}} or {'orders:0': 42}"
    if not isinstance(offsets, dict) or not offsets:
        raise ConfigurationError(f"startup_mode='specific_offsets' needs startup_offsets, e.g. {example}")
    flat: dict[str, Any] = {}
    for key, value in offsets.items():
        if isinstance(value, dict):
            flat.update({f"{key}:{partition}": offset for partition, offset in value.items()})
        else:
            flat[str(key)] = value
    result = {}
    for key, value in flat.items():
        topic, sep, partition = key.rpartition(":")
        known = topic in topics or (pattern is not None and bool(matching_topics(pattern, [topic])))
        if not sep or not partition.strip().isdigit() or not known:
            what = topics if pattern is None else f"a topic matching {pattern!r}"
            raise ConfigurationError(f"startup_offsets key {key!r} must name a partition of {what}, e.g. {example}")
        try:
            offset = int(value)
        except (TypeError, ValueError):
            offset = -1
        if offset < 0:
            raise ConfigurationError(f"startup_offsets[{key!r}] = {value!r} is not an offset (a number >= 0)")
        result[f"{topic}:{int(partition)}"] = offset
    return result
