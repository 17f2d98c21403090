"""The schemas of a batch in the Schema Registry wire format, fetched on the driver before Spark decodes.

For each part read in a registry format (the value, the key) the driver fetches the reader
schema (the subject's latest version, a pinned version, or the schema the user gave) and the
writer schemas: every version of the subject at first, then any other id the batch's records
name (spark.write_job asks again for those once it has counted them). Schemas are immutable per id,
so they are cached for the life of the process; nothing is fetched per record, and the Spark
expressions carry the schemas to the executors.

A registry that cannot be reached, or that refuses the credentials, is a ConfigurationError
naming the connection (retriable when it was not reached): it never turns records into bad
records. An id the registry does not know is a bad record's reason, not an error.
"""

from __future__ import annotations

import json
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError, MissingExtraError
from airflow_exactly_once.core.secrets import shown_url
from airflow_exactly_once.records.avro_resolution import resolution_problem
from airflow_exactly_once.records.protobuf_rows import ProtobufMessage
from airflow_exactly_once.records.protobuf_schema import compile_proto, reader_message
from airflow_exactly_once.records.wire_format import SCHEMA_TYPES

# One answer at a time is enough for a driver; a registry that does not answer in this many seconds is down.
TIMEOUT_S = 10
_CACHE: dict[tuple[str, int], tuple[str, str] | None] = {}  # (url, id) -> (schema type, schema text)
_VERSIONS: dict[tuple[str, str, int], int] = {}  # (url, subject, version) -> id
_LOCK = threading.Lock()


@dataclass
class PartSchemas:
    """What the Spark job needs to decode one part (value or key) of a batch's records."""

    part: str
    fmt: str
    reader: str
    reader_ref: str  # where the reader schema came from, for messages: "orders-value version 3", "value_schema"
    writers: dict[int, str] = field(default_factory=dict)  # id -> writer schema that resolves to the reader
    unresolvable: dict[int, str] = field(default_factory=dict)  # id -> why it does not resolve
    protobuf: ProtobufMessage | None = None  # protobuf: the reader's compiled message

    def known(self) -> set[int]:
        return set(self.writers) | set(self.unresolvable)


class Registry:
    """The registry of a pipeline, through confluent-kafka's SchemaRegistryClient."""

    def __init__(self, config: PipelineConfig) -> None:
        if not config.schema_registry:
            raise ConfigurationError(f"pipeline {config.pipeline_id!r} reads the Schema Registry wire format but "
                                     "has no registry: give schema_registry_conn_id")
        self._bind(config.schema_registry, f"connection {config.schema_registry_conn_id!r}"
                   if config.schema_registry_conn_id else "schema_registry")

    @classmethod
    def of_settings(cls, settings: dict[str, Any], origin: str) -> Registry:
        """A registry from client settings alone (a connection's Test button: no pipeline)."""
        registry = cls.__new__(cls)
        registry._bind(settings, origin)
        return registry

    def _bind(self, settings: dict[str, Any], origin: str) -> None:
        self.settings = dict(settings)
        self.url = str(self.settings["url"])
        self.origin = origin
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            try:
                from confluent_kafka.schema_registry import SchemaRegistryClient
            except ImportError as exc:
                raise MissingExtraError("Reading the Schema Registry wire format", "schema-registry",
                                        getattr(exc, "name", None)) from exc
            settings = {"timeout": TIMEOUT_S, "max.retries": 0, **self.settings}
            try:
                self._client = SchemaRegistryClient(settings)
            except (ValueError, TypeError) as exc:
                raise ConfigurationError(f"the Schema Registry settings of {self.origin} are not valid ({exc}); "
                                         "see docs/schema-registry.md for the connection's fields") from exc
        return self._client

    def call(self, what: str, function: Any, *args: Any, **kwargs: Any) -> Any:
        """`function(*args)` on the client; a registry error other than "not found" as a ConfigurationError."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return function(*args, **kwargs)
        except SchemaRegistryError as exc:
            raise self._explained(what, exc) from exc
        except Exception as exc:  # the transport: refused, reset, timed out, a TLS failure
            if _tls_failure(exc):
                raise ConfigurationError(
                    f"the Schema Registry at {shown_url(self.url)} ({self.origin}) refused the TLS handshake to "
                    f"{what}: {exc}. Check the connection's ssl.ca.location (the registry's CA) and, when the registry "
                    "asks for a client certificate, ssl.certificate.location and ssl.key.location") from exc
            raise ConfigurationError(
                f"the Schema Registry at {shown_url(self.url)} ({self.origin}) cannot be reached to {what}: "
                f"{type(exc).__name__}: {exc}. Check that it runs and that the connection's URL and TLS files are "
                "right; the batch is retried and reads the same records", retriable=True) from exc

    def _explained(self, what: str, exc: Any) -> Exception:
        status = getattr(exc, "http_status_code", None)
        where = f"the Schema Registry at {shown_url(self.url)} ({self.origin})"
        if status in (401, 403):
            return ConfigurationError(f"{where} refused the credentials (HTTP {status}) to {what}: {exc.error_message}. "
                                      "Fix the connection's Login/Password (basic auth) or its bearer token")
        if status == 404:
            return ConfigurationError(f"{where} cannot {what}: not found ({exc.error_message}). Register the "
                                      "schema, or name another subject (value_subject / key_subject) or version")
        return ConfigurationError(f"{where} failed to {what} (HTTP {status}: {exc.error_message})",
                                  retriable=status is None or status >= 500)

    def by_id(self, schema_id: int) -> tuple[str, str] | None:
        """(schema type, schema text) of an id, None when the registry does not know it (cached: ids never change)."""
        key = (self.url, schema_id)
        with _LOCK:
            if key in _CACHE:
                return _CACHE[key]
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        def fetch() -> Any:
            try:
                return self.client().get_schema(schema_id)
            except SchemaRegistryError as exc:
                if getattr(exc, "http_status_code", None) == 404:
                    return None  # not cached: an id can be registered later
                raise

        schema = self.call(f"read schema id {schema_id}", fetch)
        if schema is None:
            return None
        found = (schema.schema_type or "AVRO", schema.schema_str)
        with _LOCK:
            _CACHE[key] = found
        return found

    def subject_versions(self, subject: str) -> dict[int, str]:
        """Every version of `subject` as id -> schema text (the writer schemas a topic usually holds)."""
        client = self.client()
        versions = self.call(f"list the versions of subject {subject!r}", client.get_versions, subject)
        found: dict[int, str] = {}
        for version in versions:
            with _LOCK:
                known = _VERSIONS.get((self.url, subject, version))
            if known is None:  # a version, once registered, keeps its id and schema: asked once per process
                registered = self.call(f"read subject {subject!r} version {version}", client.get_version, subject,
                                       version)
                known = registered.schema_id
                with _LOCK:
                    _VERSIONS[(self.url, subject, version)] = known
                    _CACHE[(self.url, known)] = (registered.schema.schema_type or "AVRO",
                                                 registered.schema.schema_str)
            with _LOCK:
                cached = _CACHE[(self.url, known)]
            if cached is not None:  # always: a version's schema is cached with its id
                found[known] = cached[1]
        return found

    def reader(self, subject: str, pinned: Any) -> tuple[str, str, list[Any]]:
        """The reader schema, where it came from, and its references: the given schema, a pinned version, or the
        latest."""
        if isinstance(pinned, str) and not pinned.strip().isdigit():
            return pinned, "the given schema", []
        client = self.client()
        if pinned is None:
            registered = self.call(f"read the latest version of subject {subject!r}", client.get_latest_version,
                                   subject)
        else:
            registered = self.call(f"read subject {subject!r} version {int(pinned)}", client.get_version, subject,
                                   int(pinned))
        return registered.schema.schema_str, f"subject {subject!r} version {registered.version} (id " \
                                             f"{registered.schema_id})", list(registered.schema.references or [])

    def imports(self, references: list[Any]) -> dict[str, str]:
        """The files a schema's references name, and theirs in turn: import name -> schema text."""
        found: dict[str, str] = {}
        pending = list(references)
        while pending:
            reference = pending.pop()
            if reference.name in found:
                continue
            registered = self.call(f"read subject {reference.subject!r} version {reference.version} (a reference)",
                                   self.client().get_version, reference.subject, reference.version)
            found[reference.name] = registered.schema.schema_str
            pending.extend(registered.schema.references or [])
        return found


def subjects(config: PipelineConfig, part: str) -> list[str]:
    """The subjects of a part: the one given, or TopicNameStrategy's '<topic>-<part>' for every topic."""
    given = getattr(config, f"{part}_subject")
    return [given] if given else [f"{topic}-{part}" for topic in config.topics]


def part_schemas(config: PipelineConfig, part: str, registry: Registry | None = None) -> PartSchemas:
    """The reader schema and the writer schemas known up front (every version of the subjects) of one part."""
    registry = registry or Registry(config)
    fmt = getattr(config, f"{part}_format")
    pinned = getattr(config, f"{part}_schema")
    readers: dict[str, tuple[str, str, list[Any]]] = {}
    for subject in subjects(config, part):
        text, ref, references = registry.reader(subject, pinned)
        readers.setdefault(_canonical(text), (text, ref, references))
    if len(readers) > 1:
        where = "; ".join(r for _, r, _ in readers.values())
        raise ConfigurationError(
            f"the topics' {part} subjects have different latest schemas ({where}):"
            f" one batch has one {part} schema; give {part}_schema (a schema all of them resolve to) or "
            f"{part}_subject")
    reader, ref, references = next(iter(readers.values()))
    if fmt == "avro" and part == "value" and not _is_record(reader):
        raise ConfigurationError(f"the value's reader schema ({ref}) is not an Avro record: the transform gets one "
                                 "column per field of a record; read the value as value_format='bytes' instead")
    schemas = PartSchemas(part, fmt, reader, ref)
    if fmt == "protobuf":
        schemas.protobuf = protobuf_reader(reader, registry.imports(references), ref)
    for subject in subjects(config, part):
        for schema_id, text in registry.subject_versions(subject).items():
            add_writer(schemas, schema_id, text)
    return schemas


def protobuf_reader(text: str, imports: dict[str, str], where: str, message: str | None = None) -> ProtobufMessage:
    """The reader's .proto compiled with its imports, and the message read: the file's first, or `message`."""
    return reader_message(compile_proto(text, imports, where), where, message)


def add_writer(schemas: PartSchemas, schema_id: int, text: str) -> None:
    """Record a writer schema, or why its data cannot be read with the reader schema."""
    if schemas.fmt == "avro":
        problem = resolution_problem(text, schemas.reader)
        if problem:
            schemas.unresolvable[schema_id] = f"the writer schema id {schema_id} does not resolve to the reader " \
                                              f"schema ({schemas.reader_ref}): {problem}"
            return
    schemas.writers[schema_id] = text


def add_found_ids(schemas: PartSchemas, ids: list[int], registry: Registry) -> bool:
    """Fetch ids the records name that the subject's versions did not hold; True when one was found."""
    found = False
    for schema_id in ids:
        if schema_id in schemas.known():
            continue
        fetched = registry.by_id(schema_id)
        if fetched is None:
            continue
        schema_type, text = fetched
        if schema_type != SCHEMA_TYPES[schemas.fmt]:
            schemas.unresolvable[schema_id] = f"the writer schema id {schema_id} is a {schema_type} schema, not " \
                                              f"{schemas.fmt}"
        else:
            add_writer(schemas, schema_id, text)
        found = True
    return found


def _canonical(text: str) -> str:
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except ValueError:
        return text.strip()


def _is_record(text: str) -> bool:
    try:
        parsed = json.loads(text)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("type") == "record"


def _tls_failure(exc: BaseException) -> bool:
    """Whether a transport error is a TLS handshake that failed (a setting to fix, not worth a retry)."""
    seen: BaseException | None = exc
    for _ in range(6):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError) or "CERTIFICATE" in str(seen).upper() or "SSL" in type(seen).__name__:
            return True
        seen = seen.__cause__ or seen.__context__
    return False
