"""What a pipeline is: a source range policy, a transform and a sink, all JSON-serialisable.

The spec travels as JSON to a spark-submit job, so a transform given as a callable only
works in-process; as a "module:function" string it works everywhere.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.core.model import dumps

STARTUP_MODES = ("earliest", "latest")
DATA_LOSS_POLICIES = ("fail", "skip")
# Flink's FlinkKafkaProducer.Semantic; what each one costs and promises is in the README.
GUARANTEES = ("NONE", "AT_LEAST_ONCE", "EXACTLY_ONCE")
_PIPELINE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


@dataclass
class PipelineConfig:
    pipeline_id: str
    topics: list[str]
    sink: dict[str, Any]
    bootstrap_servers: str = ""
    startup_mode: str = "earliest"
    new_partition_start: str = "earliest"
    max_records_per_partition: int | None = None
    data_loss_policy: str = "fail"
    transform: str | None = None
    kafka_config: dict[str, Any] = field(default_factory=dict)
    guarantee: str = "EXACTLY_ONCE"
    # Opt-in: after notify_complete, copy the committed offsets to this consumer group (monitoring only).
    mirror_consumer_group: str | None = None

    def validate(self) -> "PipelineConfig":
        if not _PIPELINE_ID.match(self.pipeline_id or ""):
            raise ConfigurationError(
                f"pipeline_id {self.pipeline_id!r} is not valid: use letters, digits, '_', '.', '-' "
                "(it names transactions, folders and ledger rows)")
        if isinstance(self.topics, str):
            self.topics = [self.topics]
        if not self.topics or not all(isinstance(t, str) and t for t in self.topics):
            raise ConfigurationError("topics must be a non-empty list of Kafka topic names")
        if not self.bootstrap_servers:
            raise ConfigurationError(
                "no Kafka bootstrap servers: pass bootstrap_servers='host:port' or a kafka connection whose "
                "extra has {\"bootstrap.servers\": \"host:port\"}")
        for name, value, allowed in (("startup_mode", self.startup_mode, STARTUP_MODES),
                                     ("new_partition_start", self.new_partition_start, STARTUP_MODES),
                                     ("data_loss_policy", self.data_loss_policy, DATA_LOSS_POLICIES),
                                     ("guarantee", self.guarantee, GUARANTEES)):
            if value not in allowed:
                raise ConfigurationError(f"{name}={value!r} is not supported; choose one of {', '.join(allowed)}")
        if self.max_records_per_partition is not None and int(self.max_records_per_partition) <= 0:
            raise ConfigurationError("max_records_per_partition must be a positive number (or None for no bound)")
        if not isinstance(self.sink, dict) or "type" not in self.sink:
            raise ConfigurationError("sink must be a dict with a 'type', e.g. {'type': 'parquet', 'path': '/data/out'}")
        if self.mirror_consumer_group is not None and not (isinstance(self.mirror_consumer_group, str)
                                                           and self.mirror_consumer_group.strip()):
            raise ConfigurationError("mirror_consumer_group must be a consumer group id (a non-empty string), "
                                     "or None to leave consumer groups alone")
        if self.transform is not None and not isinstance(self.transform, str):
            raise ConfigurationError("transform in a PipelineConfig must be a 'module:function' string")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PipelineConfig":
        return cls(**data)

    def fingerprint(self) -> str:
        """Changes when what the pipeline reads, transforms or writes changes."""
        relevant = {"topics": sorted(self.topics), "sink": self.sink, "transform": self.transform}
        return hashlib.sha256(dumps(relevant).encode()).hexdigest()[:16]


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
