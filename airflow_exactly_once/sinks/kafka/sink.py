"""Kafka as the sink: Flink's two-phase commit on Kafka transactions.

Spec: {"type": "kafka", "topic": "out"} plus optional "guarantee" (NONE, AT_LEAST_ONCE,
EXACTLY_ONCE: the default), "bootstrap_servers" (default: the pipeline's),
"transaction_timeout_ms", "transactional_id_prefix" (default: the pipeline id),
"kafka_config" (client settings of the output cluster, default: the pipeline's) and
"producer_config" (producer-only settings in librdkafka's names, such as linger.ms or compression.type).

The transformed DataFrame must have a `value` column (STRING or BINARY) and may have a
`key` column; other columns are ignored. Under the sink's guarantee:

- EXACTLY_ONCE: every Spark partition writes into its own transaction and pre-commits it
  (writer.py); `commit` commits them all at once (EndTxn pipelined); a transaction the broker no
  longer has is judged by reading the output under read_committed, and a batch whose
  output was aborted is reported lost (the coordinator marks it ABORTED and the range is
  processed again).
- AT_LEAST_ONCE: records are flushed and acknowledged before the batch becomes PREPARED;
  `commit` has nothing left to do and `abort` cannot take anything back.
- NONE: records are sent with acks=0 and nobody waits for them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any

import kafka.errors as Errors
from kafka import KafkaAdminClient, KafkaProducer

from airflow_exactly_once.core.errors import (
    ConfigurationError,
    ExactlyOnceError,
    SinkError,
    TransactionLostError,
    TransformError,
)
from airflow_exactly_once.core.lineage_names import DatasetName, kafka_dataset
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import RunWriters, Sink
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.txn_budget import check_broker_maximum
from airflow_exactly_once.kafka.access import diagnose, explain_failure, is_connection_failure
from airflow_exactly_once.kafka.settings import KafkaSettings, canonical_name
from airflow_exactly_once.records.bad_records import DEAD_LETTER_COLUMNS
from airflow_exactly_once.sinks.kafka import hanging, librdkafka, probe
from airflow_exactly_once.sinks.kafka.committable import KafkaCommittable, PartitionReport
from airflow_exactly_once.sinks.kafka.spec import DEFAULT_TRANSACTION_TIMEOUT_MS, KafkaSpec
from airflow_exactly_once.sinks.kafka.transactions import (
    END_TIMEOUT_MS,
    TransactionHandle,
    end_transactions,
)
from airflow_exactly_once.sinks.kafka.wire_format import check_given_schemas, encoded, part_writers
from airflow_exactly_once.sinks.kafka.writer import KafkaPartitionWriter, transactional_id_pattern

log = logging.getLogger(__name__)

HEADERS_TYPE = "array<struct<key:string,value:binary>>"
DEAD_LETTER_HEADER_PREFIX = "aeo."
# What the broker says of a batch's transaction before committing.
_OPEN, _COMMITTED, _ABORTED = "open", "committed", "aborted"


class KafkaSink(Sink):
    spec_type = KafkaSpec
    guarantees = ("NONE", "AT_LEAST_ONCE", "EXACTLY_ONCE")
    committable_type = KafkaCommittable
    joins_reads = True  # a producer and a transaction per Spark partition: many ranges are read a core's share each

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
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
        self.wire_writers = part_writers(spec)  # value_format / key_format: the Schema Registry wire format
        # librdkafka properties; kafka-python's spelling of the same names (linger_ms) is accepted.
        self.producer_config = {canonical_name(k): v for k, v in (spec.get("producer_config") or {}).items()}
        bad = set(self.producer_config) & set(librdkafka.RESERVED)
        if bad:
            raise ConfigurationError(f"kafka sink: producer_config must not set {', '.join(sorted(bad))}; the sink "
                                     "sets them from its guarantee and the pipeline; remove them")
        try:
            librdkafka.check_producer_config(self.producer_config)
        except ValueError as exc:
            raise ConfigurationError(f"kafka sink: producer_config has settings librdkafka (the producer) does not "
                                     f"accept: {exc}") from None

    # -- settings ------------------------------------------------------------------

    def lineage_dataset(self) -> DatasetName:
        return kafka_dataset(self.client_settings().bootstrap_servers, self.topic)

    def client_settings(self, bootstrap_servers: str | None = None) -> KafkaSettings:
        """The output cluster: the sink's own servers and client settings, else the pipeline's."""
        if "kafka_config" in self.spec:
            settings = KafkaSettings.from_mapping(self.spec["kafka_config"], origin="the kafka sink's kafka_config")
        elif self.pipeline is not None:
            settings = KafkaSettings.of(self.pipeline)
        else:
            settings = KafkaSettings("")
        servers = bootstrap_servers or self.spec.get("bootstrap_servers")
        if servers:
            settings = dataclasses.replace(settings, bootstrap_servers=str(servers),
                                           origin="the kafka sink's bootstrap_servers")
        if not settings.bootstrap_servers:
            raise ConfigurationError("kafka sink: no bootstrap servers; give the sink 'bootstrap_servers' or the "
                                     "pipeline a kafka connection")
        return settings.check()

    def _failure(self, settings: KafkaSettings, exc: BaseException | str, doing: str,
                 retriable: bool = True) -> ExactlyOnceError:
        """What a client's failure means for this sink: a settings or ACL problem (ConfigurationError), else a
        SinkError (retriable as given)."""
        return explain_failure(settings, exc, doing, lambda message: SinkError(message, retriable=retriable),
                               topics=(self.topic,), topic_operations="WRITE and DESCRIBE",
                               transactional_id_prefix=self.id_prefix)

    def _explained(self, settings: KafkaSettings, exc: BaseException) -> ConfigurationError | None:
        """The settings or ACL problem behind a writer's failure, if that is what it was."""
        explained = settings.explain(exc, topics=(self.topic,), topic_operations="WRITE and DESCRIBE",
                                     transactional_id_prefix=self.id_prefix)
        if explained is None and is_connection_failure(exc):
            explained = diagnose(settings).error
        return explained

    def _producer_settings(self, settings: KafkaSettings) -> dict[str, Any]:
        return {k: v for k, v in settings.kafka_python(KafkaProducer).items() if k != "bootstrap_servers"}

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
        settings = self.client_settings()
        try:
            with probe.admin_client(settings) as admin:
                if not probe.topic_partitions(admin, self.topic, operation="WRITE"):
                    raise ConfigurationError(f"the kafka sink topic {self.topic!r} does not exist on "
                                             f"{settings.bootstrap_servers}: create it (the sink never creates topics)")
                if self.guarantee == "EXACTLY_ONCE":
                    check_broker_maximum(self.transaction_timeout_ms, probe.broker_max_transaction_timeout_ms(admin))
        except ConfigurationError:
            raise
        except Exception as exc:
            raise self._failure(settings, exc, f"checking the kafka sink on {settings.bootstrap_servers}") from exc
        check_given_schemas(self.spec, self.pipeline)

    # -- write ---------------------------------------------------------------------

    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> KafkaCommittable:
        settings = self.client_settings()
        writer = KafkaPartitionWriter(
            topic=self.topic, guarantee=self.guarantee, transactional_id_prefix=self.id_prefix, batch_seq=batch.seq,
            transaction_timeout_ms=self.transaction_timeout_ms, settings=settings, producer_config=self.producer_config)
        if self.wire_writers:
            frame = encoded(frame, self.wire_writers, self.pipeline)
        try:
            reports = run_writers(self._key_value(frame), writer)
        except Exception as exc:
            if self.guarantee == "EXACTLY_ONCE":
                log.warning("the write failed; aborting the transactions its partitions left open")
                try:
                    self.abort(batch, None)
                except ExactlyOnceError as failed:  # the write's own error matters more; abort/recovery retry this
                    log.warning("%s", failed)
            explained = self._explained(settings, exc)
            if explained is None:
                raise
            raise explained from exc
        return KafkaCommittable(self.guarantee, settings.bootstrap_servers, self.topic,
                                tuple(sorted(reports, key=lambda r: r.partition)))

    @staticmethod
    def _key_value(frame: Any) -> Any:
        """The `key`, `value` (and `headers`) columns as Kafka writes them, or a TransformError that says why not."""
        types = {f.name: f.dataType.simpleString() for f in frame.schema.fields}
        for name in ("value", "key"):
            if name in types and types[name] not in ("string", "binary"):
                raise TransformError(
                    f"the kafka sink writes the {name!r} column as bytes, but the transform returned it as "
                    f"{types[name]}; return STRING or BINARY (e.g. to_json(struct(...)) AS {name})")
        if "value" not in types:
            raise TransformError(
                f"the kafka sink needs a 'value' column (STRING or BINARY) and optionally 'key'; the transform "
                f"returned columns {', '.join(types) or 'none'}")
        if "headers" in types and types["headers"] != HEADERS_TYPE:
            raise TransformError(f"the kafka sink writes a 'headers' column of type {HEADERS_TYPE} (as Spark's Kafka "
                                 f"writer does); the transform returned {types['headers']}")
        columns = ["CAST(key AS BINARY) AS key"] if "key" in types else []
        columns += ["CAST(value AS BINARY) AS value"] + (["headers"] if "headers" in types else [])
        return frame.selectExpr(*columns)

    def shape_dead_letters(self, frame: Any) -> Any:
        """As Kafka Connect's dead-letter queue: the original key and value, where it came from and why in headers.

        With value_format on the dead-letter spec, the value is instead one record of every dead-letter column
        (the original value as bytes among them) in the wire format; the key stays the original bytes."""
        if self.wire_writers:
            if any(w.part == "key" for w in self.wire_writers):
                raise ConfigurationError("a kafka dead-letter destination keeps each bad record's original key bytes: "
                                         "remove key_format from dead_letter (value_format is allowed)")
            return frame.select(*DEAD_LETTER_COLUMNS)
        headers = ", ".join(f"named_struct('key', '{DEAD_LETTER_HEADER_PREFIX}{name}', 'value', "
                            f"CAST(CAST({name} AS STRING) AS BINARY))"
                            for name in DEAD_LETTER_COLUMNS if name not in ("key", "value"))
        return frame.selectExpr("key", "value", f"array({headers}) AS headers")

    # -- notify_complete -----------------------------------------------------------

    def commit(self, batch: Batch, committable: KafkaCommittable) -> str:
        if committable.guarantee != "EXACTLY_ONCE":
            return (f"{committable.records} records were written to {committable.topic!r} by the write task under "
                    f"{committable.guarantee}; nothing to commit")
        settings = self.client_settings(committable.bootstrap_servers)
        reports = {r.transactional_id: r for r in committable.transactions}
        admin = self._coordinator(settings, f"committing the Kafka transactions of batch {batch.seq}")
        with contextlib.closing(admin):  # one client: its connections serve the describe, EndTxn and aborts
            ended = self._end_hanging(settings, admin, committable)
            status = self._states_before_commit(settings, admin, list(reports.values()))
            to_commit = [reports[t] for t, s in status.items() if s == _OPEN]
            if to_commit and _ABORTED not in status.values():  # else commit nothing: the batch is lost or partial
                status.update(self._commit_all(settings, admin, to_commit))
            aborted = sorted(t for t, s in status.items() if s == _ABORTED)
            if aborted:
                self._lost(batch, settings, admin, reports, status, aborted)
        return (f"committed {len(reports)} Kafka transaction(s) of batch {batch.seq} ({committable.records} records) "
                f"to {committable.topic!r}{ended}")

    def verify_staged(self, batch: Batch, committable: KafkaCommittable) -> None:
        """Every transaction of the batch still open (or committed): else the batch is lost, before any commit."""
        if committable.guarantee != "EXACTLY_ONCE":
            return
        settings = self.client_settings(committable.bootstrap_servers)
        reports = {r.transactional_id: r for r in committable.transactions}
        try:
            admin = probe.new_admin_client(settings)
        except Exception as exc:  # a cheap check only: the commit that follows finds out and says why
            log.warning("cannot check the Kafka transactions of batch %s before committing (%s)", batch.seq, exc)
            return
        with contextlib.closing(admin):
            self._end_hanging(settings, admin, committable)
            status = self._states_before_commit(settings, admin, list(reports.values()))
            aborted = sorted(t for t, s in status.items() if s == _ABORTED)
            if aborted:
                self._lost(batch, settings, admin, reports, status, aborted)

    def _coordinator(self, settings: KafkaSettings, doing: str) -> KafkaAdminClient:
        """An admin client of the output cluster, or the error that says why there is none."""
        try:
            return probe.new_admin_client(settings)
        except Exception as exc:
            raise self._failure(settings, exc, doing) from exc

    def _end_timeout_ms(self, settings: KafkaSettings) -> int:
        """How long EndTxn is retried when Kafka does not answer: the producer's max.block.ms, as before."""
        return int(self._producer_settings(settings).get("max_block_ms", END_TIMEOUT_MS))

    def _states_before_commit(self, settings: KafkaSettings, admin: KafkaAdminClient,
                              reports: list[PartitionReport]) -> dict[str, str]:
        """Open / committed / aborted per transaction, before committing any: a batch whose
        transactions partly timed out is then aborted as a whole instead of half committed."""
        started = [r for r in reports if r.transaction.started]
        status = {r.transactional_id: _COMMITTED for r in reports if not r.transaction.started}
        try:
            seen = probe.transaction_states(admin, [r.transactional_id for r in started])
        except Exception as exc:  # e.g. no DESCRIBE permission: fall back to committing and judging failures
            log.warning("cannot describe the batch's transactions (%s); committing them without looking first", exc)
            seen = {}
        for report in started:
            handle = report.transaction
            state = seen.get(handle.transactional_id,
                             probe.TransactionState("Ongoing", handle.producer_id, handle.epoch))
            same = state is not None and (state.producer_id, state.epoch) == (handle.producer_id, handle.epoch)
            if same and state.state == "Ongoing":
                status[handle.transactional_id] = _OPEN
            elif same and state.state in ("PrepareCommit", "CompleteCommit"):
                status[handle.transactional_id] = _COMMITTED
            else:  # ended by someone else (timeout, fencing) or forgotten: the output decides
                status[handle.transactional_id] = self._judge(settings, report)
        return status

    def _commit_all(self, settings: KafkaSettings, admin: KafkaAdminClient,
                    reports: list[PartitionReport]) -> dict[str, str]:
        """Commit the open transactions together (EndTxn pipelined); committed or, for one the broker
        lost meanwhile, what its output says. Raises when Kafka refused or did not answer for any."""
        by_handle = {r.transaction: r for r in reports}
        answers = end_transactions(admin, list(by_handle), commit=True, timeout_ms=self._end_timeout_ms(settings))
        failed = [(h, e) for h, e in answers.items() if e is not None and not isinstance(e, TransactionLostError)]
        if failed:  # their outcome is unknown: a retry describes the batch again and decides
            handle, exc = failed[0]
            others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            raise self._failure(settings, exc, f"committing {handle.transactional_id!r}{others}",
                                exc.retriable) from exc
        status = {}
        for handle, error in answers.items():
            if error is None:
                status[handle.transactional_id] = _COMMITTED
            else:
                log.warning("%s; reading the output to see whether it was committed", error)
                status[handle.transactional_id] = self._judge(settings, by_handle[handle])
        return status

    def _judge(self, settings: KafkaSettings, report: PartitionReport) -> str:
        """Committed or aborted, from the first record the transaction wrote (read_committed)."""
        if not report.first_offsets:
            return _ABORTED  # records were sent but none acknowledged: nothing can be visible
        topic, partition, offset = report.first_offsets[0]
        try:
            visible = probe.record_visible(settings, topic, partition, offset)
        except LookupError as exc:
            raise SinkError(f"cannot tell whether transaction {report.transactional_id!r} was committed: {exc}. The "
                            "output was deleted by retention before the commit could be checked.") from exc
        if visible is None:
            raise SinkError(f"cannot tell yet whether transaction {report.transactional_id!r} was committed: the last "
                            f"stable offset of {topic}[{partition}] has not passed offset {offset}; "
                            f"{self._holders(settings, topic, partition, offset)}; retrying later decides it",
                            retriable=True)
        return _COMMITTED if visible else _ABORTED

    def _holders(self, settings: KafkaSettings, topic: str, partition: int, offset: int) -> str:
        """Which open transactions hold a partition's last stable offset at or below `offset`, and whose."""
        try:
            with probe.admin_client(settings) as admin:
                held = [t for t in hanging.open_transactions(admin, [(topic, partition)]) if t.start_offset <= offset]
                views = hanging.coordinator_views(admin, {t.producer_id for t in held}, {})
        except Exception as exc:  # noqa: BLE001 - only the message's detail: the wait's own error stands
            return f"which transaction holds it back cannot be asked ({type(exc).__name__}: {exc})"
        if not held:
            return "no transaction holds it back any more"
        owners = self._owners()
        return "held back by " + "; ".join(
            f"{t.describe()}, {views[t.producer_id][0].describe()}, "
            + (f"this pipeline's batch {owners[t.producer_id].batch_seq}" if t.producer_id in owners
               else "not this pipeline's") for t in held)

    def _lost(self, batch: Batch, settings: KafkaSettings, admin: KafkaAdminClient,
              reports: dict[str, PartitionReport], status: dict[str, str], aborted: list[str]) -> None:
        committed = sorted(t for t, s in status.items() if s == _COMMITTED and reports[t].transaction.started)
        lost_records = sum(reports[t].records for t in aborted)
        if committed:
            raise SinkError(
                f"PARTIAL COMMIT of batch {batch.seq}: transactions {', '.join(committed)} are committed but "
                f"{', '.join(aborted)} ({lost_records} records) were aborted by the broker before notify_complete "
                f"could commit them (transaction_timeout_ms={self.transaction_timeout_ms}). Processing the range "
                "again would duplicate the committed part, so the batch is left PREPARED: decide by hand, and "
                "raise transaction_timeout_ms so that notify_complete always comes in time.")
        still_open = [reports[t].transaction for t, s in status.items() if s == _OPEN]
        if still_open:
            answers = end_transactions(admin, still_open, commit=False, timeout_ms=self._end_timeout_ms(settings))
            for handle, exc in answers.items():
                if exc is not None and not isinstance(exc, TransactionLostError):  # never committed: it times out
                    log.warning("could not abort %s now (%s); it times out on its own", handle.transactional_id, exc)
        raise TransactionLostError(
            f"the Kafka transactions of batch {batch.seq} were aborted before notify_complete committed them "
            f"({', '.join(aborted)}: timed out after transaction_timeout_ms={self.transaction_timeout_ms}, or "
            f"fenced); read_committed consumers never saw their {lost_records} records",
            sink=self.type_name, batch=batch.seq, lost=aborted, reason="aborted by the broker before the commit")

    # -- abort ---------------------------------------------------------------------

    def abort(self, batch: Batch, committable: KafkaCommittable | None) -> str:
        """Abort this attempt's transactions (committable), or fence every transactional id of the batch (None).

        Fencing (a new epoch for each id the coordinators know, open or not) also stops a zombie writer of
        the batch that is still running: it can neither commit nor write into its transaction again, and a
        writer that initialises after this finds the batch no longer claimed (KafkaPartitionWriter). Raises
        an error when the broker cannot be reached: the caller keeps the release pending and tries again.
        """
        guarantee = committable.guarantee if committable is not None else self.guarantee
        if guarantee != "EXACTLY_ONCE":
            return f"records written under {guarantee} cannot be taken back"
        try:
            settings = self.client_settings(committable.bootstrap_servers if committable is not None else None)
            with probe.admin_client(settings) as admin:
                if committable is not None:
                    aborted = self._abort_all(settings, admin, [r.transaction for r in committable.transactions])
                else:
                    known = probe.matching_transactions(admin, transactional_id_pattern(self.id_prefix, batch.seq))
                    for tid in sorted(known):
                        librdkafka.fence({**settings.librdkafka(), **self.producer_config}, tid,
                                         self.transaction_timeout_ms)
                    aborted = sum(state == "Ongoing" for state in known.values())
                ended = self._end_hanging(settings, admin, committable)
        except ExactlyOnceError:
            raise
        except Exception as exc:
            raise self._failure(settings, exc, f"aborting the transactions of batch {batch.seq}") from exc
        return f"aborted {aborted} open Kafka transaction(s) of batch {batch.seq}{ended}"

    def _abort_all(self, settings: KafkaSettings, admin: KafkaAdminClient, handles: list[TransactionHandle]) -> int:
        """Abort exactly these transactions (EndTxn pipelined); how many the broker confirmed. Raises the
        first refusal or unanswered abort once all were tried (the caller keeps the release pending)."""
        if not any(h.started for h in handles):
            return 0
        answers = end_transactions(admin, handles, commit=False, timeout_ms=self._end_timeout_ms(settings))
        for handle, exc in answers.items():
            if isinstance(exc, TransactionLostError):
                log.info("Nothing to abort for %s: %s", handle, exc.reason)
            elif exc is not None:
                raise exc
        return sum(1 for h, e in answers.items() if e is None and h.started)

    # -- hanging transactions (KIP-664) ----------------------------------------------

    def _end_hanging(self, settings: KafkaSettings, admin: KafkaAdminClient,
                     committable: KafkaCommittable | None) -> str:
        """End the output topic's hanging transactions this pipeline can show are its own and safe to abort.

        Runs on every path that commits, judges or aborts a batch (notify_complete, recovery, abort and the
        release of a lost batch). Raises, not retriable, naming each hanging transaction it must not end
        and the command that ends it; returns what it ended, for the task's log. Without the ledger's
        history (a sink used on its own) it does nothing; without READ on the topic (DescribeProducers) it
        logs that it cannot look.
        """
        if self.history is None or self.guarantee != "EXACTLY_ONCE":
            return ""
        known = {} if committable is None else {r.transaction.producer_id: r.transactional_id
                                                for r in committable.transactions}
        try:
            found = hanging.scan(admin, [(self.topic, p) for p in range(probe.topic_partitions(admin, self.topic))],
                                 known)
        except (Errors.TopicAuthorizationFailedError, Errors.UnsupportedVersionError) as exc:
            log.warning("cannot look for hanging transactions in %r (%s): grant READ on the topic (DescribeProducers) "
                        "so that the pipeline finds and ends them itself", self.topic, type(exc).__name__)
            return ""
        except Errors.KafkaError as exc:  # a leader or coordinator not ready yet (a broker restarting): retry
            raise self._failure(settings, exc, f"looking for hanging transactions in {self.topic!r}") from exc
        if not found.hanging:
            return ""
        owners = self._owners()
        def visible(topic: str, partition: int, offset: int) -> bool | None:
            return probe.record_visible(settings, topic, partition, offset, timeout_s=5.0)

        reasons = {h: hanging.why_not_abort(h, owners.get(h.txn.producer_id), found.open_keys, visible)
                   for h in found.hanging}
        safe = [h for h, why in reasons.items() if why is None]
        refused = {h: why for h, why in reasons.items() if why is not None}
        servers = settings.bootstrap_servers
        try:
            ended = hanging.abort(admin, safe)
        except Errors.ClusterAuthorizationFailedError as exc:
            raise ConfigurationError(
                f"{len(safe)} hanging transaction(s) of this pipeline hold the output {self.topic!r} back "
                f"({'; '.join(h.describe() for h in safe)}), and ending them needs ALTER on the Cluster resource, "
                f"which {settings.principal} lacks ({exc}). Grant it (kafka-acls --add --allow-principal <principal> "
                "--operation Alter --cluster; docs/connections.md, ACLs) and retry, or end them yourself: " + "; ".join(h.txn.abort_command(servers) for h in safe),
                retriable=False) from exc
        for txn in ended:
            log.warning("ended a hanging transaction with an abort marker: %s", txn.describe())
        if refused:
            raise SinkError(
                f"hanging transaction(s) hold the output {self.topic!r} back (read_committed consumers see nothing "
                "after them) and the pipeline must not end them: "
                + "; ".join(f"{h.describe()}: not aborted because {why}" for h, why in refused.items())
                + ". Decide by hand; where aborting is right, run: "
                + "; ".join(h.txn.abort_command(servers) for h in refused)
                + ". Then clear this task.", retriable=False)
        return f"; ended {len(ended)} hanging transaction(s): " + "; ".join(t.describe() for t in ended)

    def _owners(self) -> dict[int, hanging.Owner]:
        """The producer ids this pipeline's ledger recorded, with their batch's state and transactions."""
        owners: dict[int, hanging.Owner] = {}
        for batch, committable in (self.history() if self.history is not None else []):
            if not isinstance(committable, KafkaCommittable):
                continue
            writes = tuple((r.transaction.producer_id, t, p, o) for r in committable.transactions
                           for t, p, o in r.first_offsets if t == self.topic)
            owner = hanging.Owner(batch.seq, batch.state in (BatchState.COMMITTED, BatchState.RETRACTED), writes)
            owners.update({r.transaction.producer_id: owner for r in committable.transactions})
        return owners
