"""Kafka as the sink: Flink's TwoPhaseCommitSinkFunction on Kafka transactions (DESIGN section 5).

Spec: {"type": "kafka", "topic": "out"} plus optional "bootstrap_servers" (default: the
pipeline's), "transaction_timeout_ms", "transactional_id_prefix" (default: the pipeline id),
"kafka_config" (client settings of the output cluster, default: the pipeline's) and
"producer_config" (producer-only settings such as linger_ms or compression_type).

The transformed DataFrame must have a `value` column (STRING or BINARY) and may have a
`key` column; other columns are ignored. Under the pipeline's `guarantee`:

- EXACTLY_ONCE: `prepare` = each Spark partition writes into its own transaction and
  pre-commits it (kafka_writer); the commit messages are the handles. `commit` resumes and
  commits every transaction; a transaction the broker no longer has is judged by reading
  the output under read_committed, and a batch whose output was aborted is reported lost
  (the coordinator marks it ABORTED and the range is processed again).
- AT_LEAST_ONCE: records are flushed and acknowledged before the batch becomes PREPARED;
  `commit` has nothing left to do and `abort` cannot take anything back.
- NONE: records are sent with acks=0 and nobody waits for them.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

from kafka import KafkaProducer

from airflow_exactly_once.core.errors import ConfigurationError, SinkError, TransactionLostError, TransformError
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import Handles, Sink
from airflow_exactly_once.core.txn_budget import check_broker_maximum
from airflow_exactly_once.sinks import kafka_probe as probe
from airflow_exactly_once.sinks.kafka_transactions import (
    KafkaTransactionError,
    TransactionHandle,
    TransactionLost,
    abort_transaction,
    commit_transaction,
)
from airflow_exactly_once.sinks.kafka_writer import WriterSettings, transactional_id_pattern, write_arrow_partition

log = logging.getLogger(__name__)

DEFAULT_TRANSACTION_TIMEOUT_MS = 600_000
# Set by the sink itself; a user value would break the protocol.
_RESERVED_PRODUCER_KEYS = {"bootstrap_servers", "transactional_id", "transaction_timeout_ms", "key_serializer",
                           "value_serializer"}
_SPEC_KEYS = {"type", "topic", "bootstrap_servers", "transaction_timeout_ms", "transactional_id_prefix",
              "kafka_config", "producer_config"}
# The broker still holds the transaction as written (pid/epoch of the handle).
_OPEN, _COMMITTED, _ABORTED = "open", "committed", "aborted"


def _underscored(settings: dict[str, Any] | None) -> dict[str, Any]:
    return {str(k).replace(".", "_"): v for k, v in (settings or {}).items()}


class KafkaSink(Sink):
    type_name = "kafka"
    guarantees = ("NONE", "AT_LEAST_ONCE", "EXACTLY_ONCE")

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        unknown = set(spec) - _SPEC_KEYS
        if unknown:
            raise ConfigurationError(f"kafka sink: unknown setting(s) {', '.join(sorted(unknown))}; "
                                     f"known: {', '.join(sorted(_SPEC_KEYS - {'type'}))}")
        if not isinstance(spec.get("topic"), str) or not spec["topic"]:
            raise ConfigurationError("the kafka sink needs an output 'topic', e.g. {'type': 'kafka', 'topic': 'out'}")
        self.topic: str = spec["topic"]
        try:
            self.transaction_timeout_ms = int(spec.get("transaction_timeout_ms") or DEFAULT_TRANSACTION_TIMEOUT_MS)
        except (TypeError, ValueError):
            raise ConfigurationError(f"kafka sink: transaction_timeout_ms={spec['transaction_timeout_ms']!r} is "
                                     "not a number of milliseconds") from None
        if self.transaction_timeout_ms <= 0:
            raise ConfigurationError("kafka sink: transaction_timeout_ms must be a positive number of milliseconds")
        self.producer_config = _underscored(spec.get("producer_config"))
        bad = set(self.producer_config) & _RESERVED_PRODUCER_KEYS
        if bad:
            raise ConfigurationError(f"kafka sink: producer_config must not set {', '.join(sorted(bad))}; the sink "
                                     "sets them (records are written as bytes); remove them")
        unknown = set(self.producer_config) - set(KafkaProducer.DEFAULT_CONFIG)
        if unknown:
            raise ConfigurationError(f"kafka sink: producer_config has settings kafka-python's KafkaProducer does "
                                     f"not know: {', '.join(sorted(unknown))}")

    # -- pipeline-derived settings -------------------------------------------------

    @property
    def guarantee(self) -> str:
        return self.pipeline.guarantee if self.pipeline else "EXACTLY_ONCE"

    @property
    def bootstrap_servers(self) -> str:
        servers = self.spec.get("bootstrap_servers") or (self.pipeline.bootstrap_servers if self.pipeline else "")
        if not servers:
            raise ConfigurationError("kafka sink: no bootstrap servers; give the sink 'bootstrap_servers' or the "
                                     "pipeline a kafka connection")
        return servers

    @property
    def client_settings(self) -> dict[str, Any]:
        """Security and timeouts of the output cluster: the sink's own, else the pipeline's."""
        if "kafka_config" in self.spec:
            return _underscored(self.spec["kafka_config"])
        return _underscored(self.pipeline.kafka_config if self.pipeline else {})

    @property
    def id_prefix(self) -> str:
        return self.spec.get("transactional_id_prefix") or (self.pipeline.pipeline_id if self.pipeline else "")

    def commit_deadline_ms(self) -> int | None:
        return self.transaction_timeout_ms if self.guarantee == "EXACTLY_ONCE" else None

    # -- plan ----------------------------------------------------------------------

    def check(self, pipeline_id: str) -> None:
        if self.pipeline is not None and self.topic in self.pipeline.topics:
            raise ConfigurationError(f"the kafka sink topic {self.topic!r} is also an input topic: every batch would "
                                     "read its own output; write to another topic")
        try:
            with probe.admin_client(self.bootstrap_servers, self.client_settings) as admin:
                if not probe.topic_partitions(admin, self.topic):
                    raise ConfigurationError(f"the kafka sink topic {self.topic!r} does not exist on "
                                             f"{self.bootstrap_servers}: create it (the sink never creates topics)")
                if self.guarantee == "EXACTLY_ONCE":
                    check_broker_maximum(self.transaction_timeout_ms, probe.broker_max_transaction_timeout_ms(admin))
        except ConfigurationError:
            raise
        except Exception as exc:
            raise SinkError(f"cannot check the kafka sink on {self.bootstrap_servers} ({type(exc).__name__}: "
                            f"{exc}); is the output cluster reachable?", retriable=True) from exc

    # -- write ---------------------------------------------------------------------

    def prepare(self, data: Any, batch: Batch, attempt: str) -> Handles:
        try:
            import pyarrow  # noqa: F401  (the executors receive the rows as Arrow batches)
        except ImportError as exc:
            raise ConfigurationError("the kafka sink needs pyarrow on the Spark driver and executors: "
                                     "pip install pyarrow") from exc
        frame = self._key_value(data)
        settings = WriterSettings(
            bootstrap_servers=self.bootstrap_servers, topic=self.topic, guarantee=self.guarantee,
            transactional_id_prefix=self.id_prefix, batch_seq=batch.seq,
            transaction_timeout_ms=self.transaction_timeout_ms,
            producer_config={**probe.config_for(KafkaProducer, self.client_settings), **self.producer_config})
        try:
            rows = frame.mapInArrow(partial(write_arrow_partition, settings), "message STRING").collect()
        except Exception as exc:
            if self.guarantee == "EXACTLY_ONCE":
                log.warning("the write failed; aborting the transactions its partitions left open")
                self.abort(batch, None)
            if "airflow_exactly_once/sinks/kafka" not in str(exc):
                raise  # reading or transforming failed: the Spark job explains it
            raise SinkError(f"writing batch {batch.seq} to Kafka topic {self.topic!r} failed: "
                            f"{_spark_cause(exc)}", retriable=True) from exc
        writers = sorted((json.loads(row.message) for row in rows), key=lambda w: w["partition"])
        return {"guarantee": self.guarantee, "bootstrap_servers": settings.bootstrap_servers, "topic": self.topic,
                "writers": writers}

    @staticmethod
    def _key_value(data: Any) -> Any:
        """The `key` and `value` columns as bytes, or a TransformError that says what is missing."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import BinaryType, StringType

        types = {f.name: f.dataType for f in data.schema.fields}
        for name in ("value", "key"):
            if name in types and not isinstance(types[name], (StringType, BinaryType)):
                raise TransformError(
                    f"the kafka sink writes the {name!r} column as bytes, but the transform returned it as "
                    f"{types[name].simpleString()}; return STRING or BINARY (e.g. to_json(struct(...)) AS {name})")
        if "value" not in types:
            raise TransformError(
                f"the kafka sink needs a 'value' column (STRING or BINARY) and optionally 'key'; the transform "
                f"returned columns {', '.join(types) or 'none'}")
        columns = [F.col("value").cast("binary").alias("value")]
        if "key" in types:
            columns.insert(0, F.col("key").cast("binary").alias("key"))
        return data.select(*columns)

    # -- notify_complete -----------------------------------------------------------

    def commit(self, batch: Batch, handles: Handles) -> str:
        if handles.get("guarantee", "EXACTLY_ONCE") != "EXACTLY_ONCE":
            return (f"{handles.get('records', '?')} records were written to {handles.get('topic')!r} by the write "
                    f"task under {handles.get('guarantee')}; nothing to commit")
        servers = handles["bootstrap_servers"]
        writers = [w for w in handles.get("writers", []) if w.get("transaction")]
        txns = {w["transaction"]["transactional_id"]: w for w in writers}
        status = self._states_before_commit(servers, writers)
        for tid in [t for t, s in status.items() if s == _OPEN]:
            if _ABORTED in status.values():  # commit nothing more: the batch is lost or partial
                break
            status[tid] = self._commit_one(servers, txns[tid])
        aborted = sorted(t for t, s in status.items() if s == _ABORTED)
        if aborted:
            self._lost(batch, servers, txns, status, aborted)
        records = sum(w.get("records", 0) for w in writers)
        return (f"committed {len(writers)} Kafka transaction(s) of batch {batch.seq} ({records} records) "
                f"to {handles['topic']!r}")

    def _states_before_commit(self, servers: str, writers: list[dict[str, Any]]) -> dict[str, str]:
        """Open / committed / aborted per transaction, before committing any: a batch whose
        transactions partly timed out is then aborted as a whole instead of half committed."""
        started = [w for w in writers if w["transaction"].get("started", True)]
        status = {w["transaction"]["transactional_id"]: _COMMITTED for w in writers if w not in started}
        try:
            with probe.admin_client(servers, self.client_settings) as admin:
                seen = probe.transaction_states(admin, [w["transaction"]["transactional_id"] for w in started])
        except Exception as exc:  # e.g. no DESCRIBE permission: fall back to committing and judging failures
            log.warning("cannot describe the batch's transactions (%s); committing them one by one", exc)
            seen = {}
        for writer in started:
            handle = writer["transaction"]
            tid = handle["transactional_id"]
            state = seen.get(tid, probe.TransactionState("Ongoing", handle["producer_id"], handle["epoch"]))
            same = state is not None and (state.producer_id, state.epoch) == (handle["producer_id"], handle["epoch"])
            if same and state.state == "Ongoing":
                status[tid] = _OPEN
            elif same and state.state in ("PrepareCommit", "CompleteCommit"):
                status[tid] = _COMMITTED
            else:  # ended by someone else (timeout, fencing) or forgotten: the output decides
                status[tid] = self._judge(servers, writer)
        return status

    def _commit_one(self, servers: str, writer: dict[str, Any]) -> str:
        handle = TransactionHandle.from_dict(writer["transaction"])
        try:
            commit_transaction(servers, handle, **self._producer_settings())
        except TransactionLost as lost:
            log.warning("%s; reading the output to see whether it was committed", lost)
            return self._judge(servers, writer)
        except KafkaTransactionError as exc:
            raise SinkError(f"committing {handle.transactional_id!r} failed: {exc}", retriable=exc.retriable) from exc
        return _COMMITTED

    def _judge(self, servers: str, writer: dict[str, Any]) -> str:
        """Committed or aborted, from the first record the transaction wrote (read_committed)."""
        tid = writer["transaction"]["transactional_id"]
        if not writer.get("first_offsets"):
            return _ABORTED  # records were sent but none acknowledged: nothing can be visible
        topic, partition, offset = writer["first_offsets"][0]
        try:
            visible = probe.record_visible(servers, self.client_settings, topic, partition, offset)
        except LookupError as exc:
            raise SinkError(f"cannot tell whether transaction {tid!r} was committed: {exc}. The output was "
                            "deleted by retention before the commit could be checked.") from exc
        if visible is None:
            raise SinkError(f"cannot tell yet whether transaction {tid!r} was committed: the last stable offset of "
                            f"{topic}[{partition}] has not passed offset {offset} (another open transaction holds "
                            "it back); retrying later decides it", retriable=True)
        return _COMMITTED if visible else _ABORTED

    def _lost(self, batch: Batch, servers: str, txns: dict[str, dict[str, Any]], status: dict[str, str],
              aborted: list[str]) -> None:
        committed = sorted(t for t, s in status.items() if s == _COMMITTED and txns[t]["transaction"].get("started"))
        lost_records = sum(txns[t].get("records", 0) for t in aborted)
        if committed:
            raise SinkError(
                f"PARTIAL COMMIT of batch {batch.seq}: transactions {', '.join(committed)} are committed but "
                f"{', '.join(aborted)} ({lost_records} records) were aborted by the broker before notify_complete "
                f"could commit them (transaction_timeout_ms={self.transaction_timeout_ms}). Processing the range "
                "again would duplicate the committed part, so the batch is left PREPARED: decide by hand, and "
                "raise transaction_timeout_ms so that notify_complete always comes in time.")
        for tid in [t for t, s in status.items() if s == _OPEN]:
            try:
                abort_transaction(servers, TransactionHandle.from_dict(txns[tid]["transaction"]),
                                  **self._producer_settings())
            except KafkaTransactionError as exc:  # never committed: the broker's timeout aborts it
                log.warning("could not abort %s now (%s); it times out on its own", tid, exc)
        raise TransactionLostError(
            f"the Kafka transactions of batch {batch.seq} were aborted before notify_complete committed them "
            f"({', '.join(aborted)}: timed out after transaction_timeout_ms={self.transaction_timeout_ms}, or "
            f"fenced); read_committed consumers never saw their {lost_records} records")

    # -- abort ---------------------------------------------------------------------

    def abort(self, batch: Batch, handles: Handles | None) -> str:
        """Abort this attempt's transactions (handles) or every open one of the batch (None). Best effort:
        a transaction that cannot be reached now is aborted by the broker's timeout anyway."""
        guarantee = (handles or {}).get("guarantee", self.guarantee)
        if guarantee != "EXACTLY_ONCE":
            return f"records written under {guarantee} cannot be taken back"
        servers = (handles or {}).get("bootstrap_servers") or self.bootstrap_servers
        try:
            if handles is not None:
                targets = [TransactionHandle.from_dict(w["transaction"]) for w in handles.get("writers", [])
                           if w.get("transaction")]
            else:
                with probe.admin_client(servers, self.client_settings) as admin:
                    targets = probe.open_transactions(admin, transactional_id_pattern(self.id_prefix, batch.seq))
            aborted = sum(abort_transaction(servers, h, **self._producer_settings()) for h in targets)
        except Exception as exc:
            log.warning("could not abort the open transactions of batch %s (%s); the broker aborts them after "
                        "transaction_timeout_ms", batch.seq, exc)
            return f"could not abort the transactions of batch {batch.seq} now: {exc}"
        return f"aborted {aborted} open Kafka transaction(s) of batch {batch.seq}"

    def _producer_settings(self) -> dict[str, Any]:
        return probe.config_for(KafkaProducer, self.client_settings)


def _spark_cause(exc: Exception) -> str:
    """The executor's own error line out of a long Spark/Py4J message."""
    text = str(exc)
    lines = [line.strip() for line in text.splitlines() if "Error" in line or "Exception" in line]
    return (lines[-1] if lines else text)[:800]
