"""The Kafka sink's committer: commits, judges and aborts a batch's transactions from its committable.

Under EXACTLY_ONCE, `commit` commits every transaction of the batch at once (EndTxn pipelined,
sinks.kafka.batch_transactions); a transaction the broker no longer has is judged by reading the
output under read_committed, and a batch whose output was aborted is reported lost (the
coordinator marks it ABORTED and the range is processed again). Every commit, check and abort
first ends the topic's hanging transactions the pipeline can show are its own
(sinks.kafka.hanging_sweep). Under AT_LEAST_ONCE and NONE the write task delivered the records
already: nothing is left to commit, and nothing can be taken back.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import ConfigurationError, ExactlyOnceError
from airflow_exactly_once.core.lineage_names import DatasetName, kafka_dataset
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import LedgerReader, StagedHistory
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.core.txn_budget import check_broker_maximum
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks.kafka import librdkafka, probe
from airflow_exactly_once.sinks.kafka.batch_transactions import ABORTED, OPEN, BatchTransactions
from airflow_exactly_once.sinks.kafka.committable import KafkaCommittable
from airflow_exactly_once.sinks.kafka.hanging_sweep import HangingSweep
from airflow_exactly_once.sinks.kafka.live_cluster import LiveCluster
from airflow_exactly_once.sinks.kafka.output import KafkaOutput
from airflow_exactly_once.sinks.kafka.spec import KafkaSpec
from airflow_exactly_once.sinks.kafka.wire_format import check_given_schemas
from airflow_exactly_once.sinks.kafka.transactional_ids import UsedNaming, prefix_users, refuse_changed_slots

log = logging.getLogger(__name__)

# A cluster's broker may not yet know a topic created a moment ago on another: how long "does not exist" must hold.
TOPIC_SETTLE_S = 3.0


class KafkaSinkCommitter(SinkCommitter[KafkaCommittable]):
    spec_type = KafkaSpec
    committable_type = KafkaCommittable

    def __init__(self, spec: dict[str, Any]) -> None:
        super().__init__(spec)
        self.output = KafkaOutput(spec, self.guarantee)
        self.sweep = HangingSweep(self.output, None)

    def bind(self, config: PipelineConfig, history: StagedHistory[KafkaCommittable] | None = None,
             ledger: LedgerReader | None = None) -> "KafkaSinkCommitter":
        super().bind(config, history, ledger)
        self.output.pipeline = config
        self.sweep = HangingSweep(self.output, history)
        return self

    def lineage_dataset(self) -> DatasetName:
        return kafka_dataset(self.output.client_settings().bootstrap_servers, self.output.topic)

    def commit_deadline_ms(self) -> int | None:
        return self.output.transaction_timeout_ms if self.guarantee == "EXACTLY_ONCE" else None

    def check(self, pipeline_id: str) -> None:
        self._check_prefix(pipeline_id)
        if self.guarantee == "EXACTLY_ONCE":
            refuse_changed_slots(self.output.naming, pipeline_id, self.ledger, self._used_namings)
        topic = self.output.topic
        if self.pipeline is not None and self.pipeline.reads_topic(topic):
            raise ConfigurationError(f"the kafka sink topic {topic!r} is also an input topic: every batch would "
                                     "read its own output; write to another topic")
        settings = self.output.client_settings()
        try:
            with probe.admin_client(settings) as admin:
                if not probe.topic_partitions(admin, topic, operation="WRITE", settle_s=TOPIC_SETTLE_S):
                    raise ConfigurationError(f"the kafka sink topic {topic!r} does not exist on "
                                             f"{settings.bootstrap_servers}: create it (the sink never creates topics)")
                if self.guarantee == "EXACTLY_ONCE":  # a node away is named in the log, not a reason to stop
                    with LiveCluster(settings, admin) as live:
                        maximum = live.ask("reading the brokers' transaction.max.timeout.ms",
                                           lambda client: probe.broker_max_transaction_timeout_ms(client, settings))
                    if maximum.brokers.away:
                        log.warning("transaction.max.timeout.ms=%s read from node(s) %s; %s", maximum.ms,
                                    ", ".join(map(str, maximum.brokers.serving)), maximum.brokers.note())
                    check_broker_maximum(self.output.transaction_timeout_ms, maximum.ms)
        except ConfigurationError:
            raise
        except Exception as exc:
            raise self.output.failure(settings, exc, f"checking the kafka sink on {settings.bootstrap_servers}") \
                from exc
        check_given_schemas(self.spec, self.pipeline)

    def _used_namings(self) -> dict[int, UsedNaming]:
        """How the ledger's batches of this output named their transactional ids, by seq."""
        return {batch.seq: UsedNaming(batch.seq, committable.id_slot, committable.id_slots)
                for batch, committable in (self.history() if self.history is not None else [])
                if isinstance(committable, KafkaCommittable) and committable.guarantee == "EXACTLY_ONCE"}

    def _check_prefix(self, pipeline_id: str) -> None:
        """Refuse a transactional id prefix another pipeline of the ledger uses: their ids would fence each other."""
        if self.ledger is None or self.guarantee != "EXACTLY_ONCE":
            return
        prefix = self.output.id_prefix
        users = prefix_users(prefix, self.ledger.list_pipelines(), pipeline_id)
        if users:
            raise ConfigurationError(
                f"the kafka sink's transactional_id_prefix {prefix!r} is also used by pipeline(s) {', '.join(users)} "
                "of this ledger: each would fence and abort the other's transactions. Give this sink its own "
                "transactional_id_prefix (unique on the cluster), e.g. the pipeline id", retriable=False)

    def commit(self, batch: Batch, committable: KafkaCommittable) -> str:
        if committable.guarantee != "EXACTLY_ONCE":
            return (f"{committable.records} records were written to {committable.topic!r} by the write task under "
                    f"{committable.guarantee}; nothing to commit")
        settings = self.output.client_settings(committable.bootstrap_servers)
        reports = {r.held_transaction.transactional_id: r for r in committable.transactions}
        try:
            admin = probe.new_admin_client(settings)
        except Exception as exc:
            raise self.output.failure(settings, exc, f"committing the Kafka transactions of batch {batch.seq}") \
                from exc
        with contextlib.closing(admin):  # one client: its connections serve the describe, EndTxn and aborts
            ended = self.sweep.end(settings, admin, committable)
            transactions = self._transactions(settings, admin)
            status = transactions.states_before_commit(list(reports.values()))
            to_commit = [reports[t] for t, s in status.items() if s == OPEN]
            if to_commit and ABORTED not in status.values():  # else commit nothing: the batch is lost or partial
                status.update(transactions.commit_all(to_commit))
            aborted = sorted(t for t, s in status.items() if s == ABORTED)
            if aborted:
                transactions.lost(batch, reports, status, aborted)
        return (f"committed {len(reports)} Kafka transaction(s) of batch {batch.seq} ({committable.records} records) "
                f"to {committable.topic!r}{ended}")

    def verify_staged(self, batch: Batch, committable: KafkaCommittable) -> None:
        """Every transaction of the batch still open (or committed): else the batch is lost, before any commit."""
        if committable.guarantee != "EXACTLY_ONCE":
            return
        settings = self.output.client_settings(committable.bootstrap_servers)
        reports = {r.held_transaction.transactional_id: r for r in committable.transactions}
        try:
            admin = probe.new_admin_client(settings)
        except Exception as exc:  # a cheap check only: the commit that follows finds out and says why
            log.warning("cannot check the Kafka transactions of batch %s before committing (%s)", batch.seq, exc)
            return
        with contextlib.closing(admin):
            self.sweep.end(settings, admin, committable)
            transactions = self._transactions(settings, admin)
            status = transactions.states_before_commit(list(reports.values()))
            aborted = sorted(t for t, s in status.items() if s == ABORTED)
            if aborted:
                transactions.lost(batch, reports, status, aborted)

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
        output = self.output
        try:
            settings = output.client_settings(committable.bootstrap_servers if committable is not None else None)
            with probe.admin_client(settings) as admin:
                if committable is not None:
                    aborted = self._transactions(settings, admin).abort_all(
                        [r.held_transaction for r in committable.transactions])
                else:
                    naming = output.naming
                    later = naming.later_holders(batch, self.ledger) if self.ledger is not None else []
                    if later:  # they took the slot over, and their InitProducerId fenced this batch's producers
                        log.warning("not fencing slot %s of batch %s: batch %s uses it now", naming.slot(batch.seq),
                                    batch.seq, later[0].seq)
                    known: dict[str, str] = {}
                    if not later:
                        pattern = naming.batch_pattern(batch.seq)
                        with LiveCluster(settings, admin) as live:  # asked again while a coordinator is away
                            known = live.ask(f"listing the transactions matching {pattern}", lambda client: (
                                probe.matching_transactions(client, settings, pattern)))
                    for tid in sorted(known):
                        librdkafka.fence({**settings.librdkafka(), **output.producer_config}, tid,
                                         output.transaction_timeout_ms)
                    aborted = sum(state == "Ongoing" for state in known.values())
                ended = self.sweep.end(settings, admin, committable)
        except ExactlyOnceError:
            raise
        except Exception as exc:
            raise output.failure(settings, exc, f"aborting the transactions of batch {batch.seq}") from exc
        return f"aborted {aborted} open Kafka transaction(s) of batch {batch.seq}{ended}"

    def _transactions(self, settings: KafkaSettings, admin: Any) -> BatchTransactions:
        return BatchTransactions(self.output, settings, admin, self.sweep.owners)
