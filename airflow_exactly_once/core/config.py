"""What a pipeline is: a source range policy, a transform and a sink, all JSON-serialisable.

The spec travels as JSON to a spark-submit job, so a transform given as a callable only
works in-process; as a "module:function" string it works everywhere.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, TypeVar

from airflow_exactly_once.core.declaration import argument
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.model import dumps
from airflow_exactly_once.core.secrets import is_redacted, redacted_value, secret_values
from airflow_exactly_once.core.timestamps import to_epoch_ms
from airflow_exactly_once.core.topics import compile_topic_pattern, matching_topics

# Where a partition starts when the ledger knows nothing about it (FlinkKafkaConsumer's
# setStartFrom*). The ledger always wins: these only place partitions seen for the first time.
STARTUP_MODES = ("earliest", "latest", "timestamp", "specific_offsets", "group_offsets")
NEW_PARTITION_STARTS = ("earliest", "latest")
DATA_LOSS_POLICIES = ("fail", "skip")
# Flink's FlinkKafkaProducer.Semantic; what each one costs and promises: docs/sinks/kafka.md.
GUARANTEES = ("NONE", "AT_LEAST_ONCE", "EXACTLY_ONCE")
# continuation: each run continues where the last committed batch ended.
# interval: each run reads the records of its Airflow data interval (by record timestamp).
RANGE_MODES = ("continuation", "interval")
INTERVAL_RERUNS = ("noop", "replace")
VALUE_FORMATS = ("json", "avro", "string", "bytes", "protobuf", "json_schema")
# Formats read in the Schema Registry wire format through the registry of `schema_registry_conn_id`
# (avro only with a registry: without one, value_format="avro" is bare Avro under value_schema).
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")
KEY_FORMATS = ("string", "bytes", *REGISTRY_FORMATS)
# The registry client settings (confluent-kafka's SchemaRegistryClient names) that hold secrets.
REGISTRY_SECRET_KEYS = ("basic.auth.user.info", "bearer.auth.token", "ssl.key.password")
BAD_RECORD_POLICIES = ("fail", "dead_letter", "skip")
_PIPELINE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


@dataclass(kw_only=True)
class PipelineConfig:
    """Every pipeline setting, declared once: the operators take these as arguments (see operators.arguments).

    Keyword-only: `topics` and `topic_pattern` are alternatives, so neither is a required positional argument."""

    pipeline_id: str = argument(doc="Names the pipeline in the ledger, transactions and folders; one per "
                                    "topics-to-sink flow (letters, digits, '_', '.', '-').")
    topics: list[str] = argument(doc="The Kafka topic(s) to read (a name or a list); or give topic_pattern.",
                                 factory=list, shown_default="none: give topics or topic_pattern")
    topic_pattern: str | None = argument(None, "Instead of topics: a regular expression matched against whole topic "
                                               "names (as Spark's subscribePattern); each plan reads every matching "
                                               "topic, and a topic found after the first plan starts at its earliest "
                                               "offset. Topics starting with '__' never match.")
    sink: dict[str, Any] = argument(doc="Where the output goes: a dict with a 'type' ({sink_types}) "
                                        "and that sink's settings; see the sink pages of the docs.")
    bootstrap_servers: str = argument("", "Kafka servers 'host:port,...'; default: the kafka connection's "
                                          "'bootstrap.servers'.")
    startup_mode: str = argument("earliest", "Where a new pipeline starts: earliest, latest, timestamp, "
                                             "specific_offsets or group_offsets (the ledger always wins later).",
                                 choices=STARTUP_MODES)
    new_partition_start: str = argument("earliest", "Where partitions that appear later start: earliest or "
                                                    "latest.", choices=NEW_PARTITION_STARTS)
    max_records_per_partition: int | None = argument(None, "Upper bound of offsets per partition in one batch "
                                                           "(continuation mode); None reads up to the end.")
    local_read_max_records: int = argument(
        50_000, "A batch of at most this many offsets is read by the write's own process (confluent-kafka, "
              "read_committed) and handed to Spark as a local relation: faster than Spark's Kafka source for small "
              "batches; larger batches, and every batch with 0, use Spark's Kafka source.")
    data_loss_policy: str = argument("fail", "What to do when planned offsets are gone (retention, deleted "
                                             "topic): fail, or skip and record the loss.", choices=DATA_LOSS_POLICIES)
    transform: str | None = argument(None, "A function DataFrame -> DataFrame, or 'module:function' (needed on "
                                           "a Spark cluster).", templated=False)
    kafka_config: dict[str, Any] = argument(doc="Kafka client settings (librdkafka/Java names such as "
                                                "security.protocol) on top of the kafka connection's extra.",
                                            factory=dict)
    guarantee: str | None = argument(None, "Old spelling of the Kafka sink's 'guarantee' (NONE, AT_LEAST_ONCE, "
                                           "EXACTLY_ONCE); give it in the sink spec instead.", choices=GUARANTEES)
    mirror_consumer_group: str | None = argument(None, "Opt-in: after each commit, copy the committed offsets "
                                                       "to this consumer group (monitoring only).")
    startup_timestamp: int | str | None = argument(None, "startup_mode='timestamp': epoch ms or ISO-8601 time "
                                                         "to start from.")
    startup_offsets: dict[str, Any] | None = argument(None, "startup_mode='specific_offsets': {'topic': "
                                                            "{partition: offset}}.")
    startup_group_id: str | None = argument(None, "startup_mode='group_offsets': the consumer group whose "
                                                  "committed offsets say where to start.")
    startup_fallback: str = argument("earliest", "startup_mode timestamp/specific_offsets/group_offsets: where "
                                                 "partitions they say nothing about start.",
                                     choices=NEW_PARTITION_STARTS)
    range_mode: str = argument("continuation", "continuation (each run continues where the last batch ended) or "
                                               "interval (each run reads its data interval).", choices=RANGE_MODES)
    interval_rerun: str = argument("noop", "range_mode='interval': re-running a processed interval is a recorded "
                                           "no-op (noop) or replaces its output (replace).", choices=INTERVAL_RERUNS)
    value_format: str | None = argument(None, "Decode the Kafka value before the transform: json or avro (with "
                                              "value_schema), string or bytes, or protobuf / json_schema in the "
                                              "Schema Registry wire format (avro too, with schema_registry_conn_id); "
                                              "None hands the transform Kafka's raw columns.",
                                        choices=VALUE_FORMATS)
    value_schema: Any = argument(None, "value_format json: a Spark DDL string or StructType; avro: the Avro schema "
                                       "(JSON). A value that does not decode under it is a bad record.",
                                 templated=False)
    key_format: str | None = argument(None, "Decode the Kafka key before the transform: string or bytes, or avro / "
                                            "protobuf / json_schema in the Schema Registry wire format (the decoded "
                                            "key replaces the key column); None leaves it bytes.",
                                      choices=KEY_FORMATS)
    key_schema: Any = argument(None, "Registry formats: the key's reader schema: None for its subject's latest "
                                     "version, a version number to pin one, or the schema itself.",
                               templated=False)
    value_subject: str | None = argument(None, "Registry formats: the subject of the value's reader schema; default "
                                               "'<topic>-value' (TopicNameStrategy).")
    key_subject: str | None = argument(None, "Registry formats: the subject of the key's reader schema; default "
                                             "'<topic>-key'.")
    bad_record_policy: str = argument("fail", "What a bad record does: fail (the batch fails, naming it), "
                                              "dead_letter (it goes to the dead-letter destination in the same "
                                              "commit) or skip (counted and recorded, not written).",
                                      choices=BAD_RECORD_POLICIES)
    dead_letter: dict[str, Any] | None = argument(None, "Where dead letters go: a sink spec ({'type': 'kafka', "
                                                        "'topic': 'orders_dlq'}); default: beside the output "
                                                        "(a _dead_letter folder, a <table>_dead_letter table).")
    max_bad_records: int | float | None = argument(None, "Fail the batch when it has more bad records than this "
                                                         "(a count, or a fraction below 1), whatever the policy.")
    retention_batches: int | None = argument(1000, "Retention: the ledger keeps at least this many of the newest "
                                                   "batches (None: no bound by count); see docs/ledger.md.")
    retention_days: int | float | None = argument(7, "Retention: the ledger keeps at least the batches of these last "
                                                     "days (None: no bound by age); older batches beyond "
                                                     "retention_batches are pruned, keeping a committed floor. "
                                                     "None for both keeps every batch.")
    # Where bootstrap_servers came from, for error messages (set by the operators; not an argument).
    kafka_origin: str = field(default="bootstrap_servers", metadata={"argument": False})
    # The `kafka` connection the settings came from (set by the operators; not an argument): readers of
    # the ledger (the ledger page) take the secrets that the ledger does not store from it.
    kafka_conn_id: str | None = field(default=None, metadata={"argument": False})
    # The Schema Registry of the registry formats as client settings (url, basic.auth.user.info, bearer.auth.token,
    # ssl.*: confluent-kafka's names), taken from the operators' schema_registry_conn_id (not an argument).
    schema_registry: dict[str, Any] | None = field(default=None, metadata={"argument": False})
    schema_registry_conn_id: str | None = field(default=None, metadata={"argument": False})
    # Where the secrets are, as key paths such as ["sink", "kafka_config", "sasl.password"] (not an argument):
    # found by airflow_exactly_once.pipeline_check.checked() from the Kafka settings and the sinks' declarations.
    # None until then, and a config whose secrets are not known is never stored.
    secret_paths: list[list[str]] | None = field(default=None, metadata={"argument": False})

    def validate(self) -> "PipelineConfig":
        if not _PIPELINE_ID.match(self.pipeline_id or ""):
            raise ConfigurationError(
                f"pipeline_id {self.pipeline_id!r} is not valid: use letters, digits, '_', '.', '-' "
                "(it names transactions, folders and ledger rows)")
        self._validate_topics()
        for name, value, allowed in (("startup_mode", self.startup_mode, STARTUP_MODES),
                                     ("new_partition_start", self.new_partition_start, NEW_PARTITION_STARTS),
                                     ("startup_fallback", self.startup_fallback, NEW_PARTITION_STARTS),
                                     ("data_loss_policy", self.data_loss_policy, DATA_LOSS_POLICIES),
                                     ("range_mode", self.range_mode, RANGE_MODES),
                                     ("bad_record_policy", self.bad_record_policy, BAD_RECORD_POLICIES),
                                     ("interval_rerun", self.interval_rerun, INTERVAL_RERUNS)):
            if value not in allowed:
                raise ConfigurationError(f"{name}={value!r} is not supported; choose one of {', '.join(allowed)}")
        self._validate_startup()
        if self.max_records_per_partition is not None and int(self.max_records_per_partition) <= 0:
            raise ConfigurationError("max_records_per_partition must be a positive number (or None for no bound)")
        self._validate_local_read()
        self._validate_retention()
        if not isinstance(self.sink, dict) or "type" not in self.sink:
            raise ConfigurationError("sink must be a dict with a 'type', e.g. {'type': 'parquet', 'path': '/data/out'}")
        self._fold_guarantee()
        self._validate_decoding()
        if self.mirror_consumer_group is not None and not (isinstance(self.mirror_consumer_group, str)
                                                           and self.mirror_consumer_group.strip()):
            raise ConfigurationError("mirror_consumer_group must be a consumer group id (a non-empty string), "
                                     "or None to leave consumer groups alone")
        if self.transform is not None and not isinstance(self.transform, str):
            raise ConfigurationError("transform in a PipelineConfig must be a 'module:function' string")
        return self

    def _validate_topics(self) -> None:
        """Exactly one of `topics` (names) and `topic_pattern` (a regular expression over names)."""
        if isinstance(self.topics, str):
            self.topics = [self.topics]
        self.topics = list(self.topics or [])
        if self.topic_pattern in ("", None):
            self.topic_pattern = None
            if not self.topics or not all(isinstance(t, str) and t for t in self.topics):
                raise ConfigurationError("give the Kafka topics to read: topics='orders' (a name or a list of names), "
                                         "or topic_pattern='orders\\\\..*' (every topic whose whole name matches)")
            return
        if self.topics:
            raise ConfigurationError(f"give either topics or topic_pattern, not both (topics={self.topics}, "
                                     f"topic_pattern={self.topic_pattern!r}): a pattern already names every topic "
                                     "the pipeline reads; put the listed names into the pattern, or drop it")
        compile_topic_pattern(self.topic_pattern)
        if self.range_mode == "interval":
            raise ConfigurationError("topic_pattern does not apply to range_mode='interval' yet: an interval's "
                                     "boundaries are fixed per partition the first time it runs, so a topic found "
                                     "later would be missing from intervals already fixed; list the topics "
                                     "(topics=[...]) or use range_mode='continuation'")

    def reads_topic(self, topic: str) -> bool:
        """Whether the pipeline reads `topic`: listed, or matched by topic_pattern (now or when it is created)."""
        if self.topic_pattern is not None:
            return bool(matching_topics(self.topic_pattern, [topic]))
        return topic in self.topics

    def reads(self) -> str:
        """What the pipeline reads, for messages: the topic list or the pattern."""
        if self.topic_pattern is not None:
            return f"the topics matching {self.topic_pattern!r}"
        return ", ".join(self.topics)

    def _validate_local_read(self) -> None:
        value = self.local_read_max_records
        number = _number(value, int)
        if number is None or number < 0:
            raise ConfigurationError(f"local_read_max_records={value!r}: give a whole number of offsets, e.g. 50000 "
                                     "(0 reads every batch with Spark's Kafka source)")
        self.local_read_max_records = number

    def _validate_retention(self) -> None:
        """Whole numbers of batches (at least 1: the newest committed batch always stays), days above 0."""
        for name, kind in (("retention_batches", int), ("retention_days", float)):
            value = getattr(self, name)
            if value is None:
                continue
            number = _number(value, kind)
            if number is None or number <= 0:
                example = "1000" if kind is int else "7 (or 0.5 for twelve hours)"
                raise ConfigurationError(f"{name}={value!r}: give a number above 0, e.g. {example}, or None to "
                                         "not bound retention by it (None for both keeps every batch)")
            setattr(self, name, number if kind is int or number != int(number) else int(number))

    def uses_registry(self, part: str = "value") -> bool:
        """Whether the value (or the key) is read in the wire format through the Schema Registry."""
        fmt = self.value_format if part == "value" else self.key_format
        return fmt in REGISTRY_FORMATS and (fmt != "avro" or part == "key" or bool(
            self.schema_registry or self.schema_registry_conn_id))

    def _validate_registry(self) -> None:
        """Registry formats need the registry; their reader schema is a version, a schema, or the latest."""
        if self.key_format is not None and self.key_format not in KEY_FORMATS:
            raise ConfigurationError(f"key_format={self.key_format!r} is not supported; choose one of "
                                     f"{', '.join(KEY_FORMATS)}, or None to leave the key bytes")
        for part in ("value", "key"):
            fmt, schema = getattr(self, f"{part}_format"), getattr(self, f"{part}_schema")
            if not self.uses_registry(part):
                if part == "key" and schema is not None:
                    raise ConfigurationError("key_schema is only used with key_format avro, protobuf or json_schema")
                if getattr(self, f"{part}_subject") is not None:
                    raise ConfigurationError(f"{part}_subject is only used with {part}_format avro, protobuf or "
                                             "json_schema read through a Schema Registry (schema_registry_conn_id)")
                continue
            if not (self.schema_registry or self.schema_registry_conn_id):
                raise ConfigurationError(f"{part}_format={fmt!r} reads the Schema Registry wire format: give "
                                         "schema_registry_conn_id='<a schema_registry connection>' (its URL and "
                                         "credentials)")
            if self.topic_pattern is not None and not getattr(self, f"{part}_subject"):
                raise ConfigurationError(f"{part}_format={fmt!r} with topic_pattern needs {part}_subject='<subject>': "
                                         f"the default subject is '<topic>-{part}' per topic, and the topics a "
                                         "pattern will match are not known when the batch's reader schema is fixed")
            if isinstance(schema, bool) or (isinstance(schema, (int, float)) and int(schema) != schema):
                raise ConfigurationError(f"{part}_schema={schema!r}: give a version number, the schema, or None for "
                                         "the subject's latest version")
            if isinstance(schema, dict):
                setattr(self, f"{part}_schema", json.dumps(schema))

    def _validate_decoding(self) -> None:
        """value_format needs its schema; bad-record settings must make sense together."""
        if self.value_format is not None and self.value_format not in VALUE_FORMATS:
            raise ConfigurationError(f"value_format={self.value_format!r} is not supported; choose one of "
                                     f"{', '.join(VALUE_FORMATS)}, or None for Kafka's raw columns")
        self._validate_registry()
        if self.value_format in ("protobuf", "json_schema") or self.uses_registry("value"):
            pass  # the registry's schemas, checked by _validate_registry
        elif self.value_format in ("json", "avro") and not self.value_schema:
            example = "'id BIGINT, name STRING'" if self.value_format == "json" else "an Avro record schema (JSON)"
            raise ConfigurationError(f"value_format={self.value_format!r} needs value_schema, e.g. {example}: a value "
                                     "that does not decode under it is a bad record")
        if self.value_schema is not None and self.value_format not in ("json", *REGISTRY_FORMATS):
            raise ConfigurationError("value_schema is only used with value_format json, avro, protobuf or "
                                     "json_schema")
        if self.value_format == "avro" and isinstance(self.value_schema, dict):
            self.value_schema = json.dumps(self.value_schema)  # stored as the JSON Spark's from_avro takes
        if self.value_schema is not None and not isinstance(self.value_schema, (str, int)):
            self.value_schema = self.value_schema.simpleString() if hasattr(self.value_schema, "simpleString") \
                else str(self.value_schema)  # a StructType is stored as its DDL
        if self.dead_letter is not None and self.bad_record_policy != "dead_letter":
            raise ConfigurationError("dead_letter is only used with bad_record_policy='dead_letter'")
        if self.dead_letter is not None and (not isinstance(self.dead_letter, dict) or "type" not in self.dead_letter):
            raise ConfigurationError("dead_letter must be a sink spec with a 'type', e.g. {'type': 'kafka', "
                                     "'topic': 'orders_dlq'}")
        limit = self.max_bad_records
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 0
                                  or (isinstance(limit, float) and limit >= 1)):
            raise ConfigurationError(f"max_bad_records={limit!r}: give a count (an int >= 0) or a fraction "
                                     "(a float below 1, e.g. 0.01 for 1%)")

    def _fold_guarantee(self) -> None:
        """`guarantee=` is the old spelling of the sink's own setting: move it into the sink spec.

        Only the Kafka sink has more than one guarantee, so it belongs to the sink; the default
        (EXACTLY_ONCE) is not written into the spec, so existing pipelines keep their fingerprint.
        """
        if self.guarantee is None:
            return
        if self.guarantee not in GUARANTEES:
            raise ConfigurationError(f"guarantee={self.guarantee!r} is not supported; choose one of "
                                     f"{', '.join(GUARANTEES)}")
        given = self.sink.get("guarantee")
        if given is not None and given != self.guarantee:
            raise ConfigurationError(f"guarantee={self.guarantee!r} contradicts the sink's guarantee={given!r}; "
                                     "give it once, in the sink spec")
        if given is None and self.guarantee != "EXACTLY_ONCE":
            self.sink = {**self.sink, "guarantee": self.guarantee}
        self.guarantee = None

    def _validate_startup(self) -> None:
        """Check the startup mode's own argument and bring it into its stored form."""
        if self.startup_mode == "timestamp":
            self.startup_timestamp = to_epoch_ms(self.startup_timestamp, "startup_timestamp (startup_mode='timestamp')")
        elif self.startup_timestamp not in (None, ""):
            raise ConfigurationError("startup_timestamp is only used with startup_mode='timestamp'; remove it or "
                                     "set startup_mode='timestamp'")
        if self.startup_mode == "specific_offsets":
            self.startup_offsets = normalize_offsets(self.startup_offsets, self.topics, self.topic_pattern)
        elif self.startup_offsets:
            raise ConfigurationError("startup_offsets is only used with startup_mode='specific_offsets'")
        if self.startup_mode == "group_offsets" and not self.startup_group_id:
            raise ConfigurationError("startup_mode='group_offsets' needs startup_group_id='<consumer group>' (the "
                                     "group whose committed offsets say where to start)")
        if self.range_mode == "interval":
            if self.max_records_per_partition is not None:
                raise ConfigurationError("max_records_per_partition does not apply to range_mode='interval': each "
                                         "run reads exactly its data interval; remove it or use a shorter schedule")
            if self.startup_mode != "earliest":
                raise ConfigurationError(f"startup_mode={self.startup_mode!r} does not apply to range_mode='interval':"
                                         " each run starts at the first record of its data interval; remove it")

    def startup_offset_map(self) -> dict[tuple[str, int], int]:
        """startup_offsets as {(topic, partition): offset}."""
        result = {}
        for key, offset in (self.startup_offsets or {}).items():
            topic, _, partition = key.rpartition(":")
            result[(topic, int(partition))] = int(offset)
        return result

    def to_dict(self) -> dict[str, Any]:
        """Everything, secrets included: what travels to executors and in-process writes."""
        return asdict(self)

    def to_stored_dict(self) -> dict[str, Any]:
        """What the ledger keeps: every value at `secret_paths` replaced by REDACTED (a URL keeps all but its
        password); see secrets()."""
        if self.secret_paths is None:
            raise RuntimeError(f"pipeline {self.pipeline_id}: its secrets are not known yet; build the config with "
                               "airflow_exactly_once.pipeline_check.checked(), which finds them, before storing it")
        stored = asdict(self)
        for path, value in self._secret_values(stored):
            _set(stored, path, redacted_value(value))
        return stored

    def secrets(self) -> list[list[Any]]:
        """The values to_stored_dict() leaves out, as [path, value] pairs: what travels to a write that reads
        its settings from the ledger (a spark-submit job's environment)."""
        return [[path, value] for path, value in self._secret_values(asdict(self))]

    def redacted_paths(self) -> list[list[str]]:
        """The secrets a stored config no longer holds (a reader must get them elsewhere, or do without)."""
        data = asdict(self)
        return [list(path) for path in self.secret_paths or () if is_redacted(_get(data, path))]

    def secret_texts(self) -> list[str]:
        """The secrets as text a masker or a scrubber looks for (a URL's password on its own too)."""
        return secret_values(asdict(self), self.secret_paths or ())

    def with_secrets(self, secrets: list[list[Any]]) -> "PipelineConfig":
        """A stored config made whole again with secrets() of the original."""
        data = self.to_dict()
        for path, value in secrets:
            _set(data, path, value)
        return PipelineConfig.from_dict(data)

    def _secret_values(self, data: dict[str, Any]) -> list[tuple[list[str], Any]]:
        """The secrets found at `secret_paths` in `data` (this config as a dict)."""
        found = []
        for path in self.secret_paths or ():
            value = _get(data, path)
            if value not in (None, "") and not is_redacted(value):
                found.append((list(path), value))
        return found

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PipelineConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def fingerprint(self) -> str:
        """Changes when what the pipeline reads, transforms or writes changes."""
        relevant = {"topics": sorted(self.topics), "sink": self.sink, "transform": self.transform}
        if self.topic_pattern is not None:  # added later, likewise
            relevant["topic_pattern"] = self.topic_pattern
        if self.value_format is not None:  # added later: pipelines without decoding keep their fingerprint
            relevant.update(value_format=self.value_format, value_schema=self.value_schema)
        for name in ("key_format", "key_schema", "value_subject", "key_subject"):  # added later, likewise
            if getattr(self, name) is not None:
                relevant[name] = getattr(self, name)
        return hashlib.sha256(dumps(relevant).encode()).hexdigest()[:16]


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


def _get(data: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _set(data: dict[str, Any], path: list[str], value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(data.get(key), dict):
            return
        data = data[key]
    data[path[-1]] = value


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


Transform = Callable[[Any], Any]


def resolve_transform(transform: str | Transform | None) -> Transform | None:
    """Turn 'package.module:function' into the function; callables pass through."""
    if transform is None or callable(transform):
        return transform
    module_name, sep, attr = str(transform).partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"transform {transform!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"transform module {module_name!r} cannot be imported ({exc}); "
                                 "make it importable on the Airflow worker and the Spark driver") from exc
    try:
        function = getattr(module, attr)
    except AttributeError as exc:
        raise ConfigurationError(f"module {module_name!r} has no function {attr!r} (transform {transform!r})") from exc
    if not callable(function):
        raise ConfigurationError(f"transform {transform!r} is not callable")
    return function


def transform_name(transform: str | Transform | None) -> str | None:
    """A stable name for the fingerprint: the string itself, or module:qualname of a callable."""
    if transform is None or isinstance(transform, str):
        return transform
    return f"{getattr(transform, '__module__', '?')}:{getattr(transform, '__qualname__', repr(transform))}"
