"""What a pipeline is: a source range policy, a transform and a sink, all JSON-serialisable.

The spec travels as JSON to a spark-submit job, so a transform given as a callable only
works in-process; as a "module:function" string it works everywhere. What values each setting
may take is checked in core.config_checks (`validate_config`).
"""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable

from airflow_exactly_once.core.declaration import argument
from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.model import dumps
from airflow_exactly_once.core.secrets import is_redacted, redacted_value, secret_values
from airflow_exactly_once.core.topics import matching_topics

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

    def uses_registry(self, part: str = "value") -> bool:
        """Whether the value (or the key) is read in the wire format through the Schema Registry."""
        fmt = self.value_format if part == "value" else self.key_format
        return fmt in REGISTRY_FORMATS and (fmt != "avro" or part == "key" or bool(
            self.schema_registry or self.schema_registry_conn_id))

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
