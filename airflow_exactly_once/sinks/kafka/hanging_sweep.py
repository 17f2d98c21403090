"""Ending the output topic's hanging transactions (KIP-664) that a pipeline can show are its own.

The Kafka committer sweeps on every path that commits, judges or aborts a batch (notify_complete,
recovery, abort and the release of a lost batch); sinks.kafka.hanging finds and judges what hangs,
this module decides with the ledger's record of the pipeline's batches (core.sink.StagedHistory)
and ends what is safe to end, or says why not and how to end it by hand.
"""

from __future__ import annotations

import logging

import kafka.errors as Errors
from kafka import KafkaAdminClient

from airflow_exactly_once.core.errors import ConfigurationError, SinkError
from airflow_exactly_once.core.sink import StagedHistory
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks.kafka import hanging, probe
from airflow_exactly_once.sinks.kafka.committable import KafkaCommittable
from airflow_exactly_once.sinks.kafka.live_cluster import LiveCluster
from airflow_exactly_once.sinks.kafka.output import KafkaOutput

log = logging.getLogger(__name__)


class HangingSweep:
    """The sweep of one Kafka output, with the ledger's history of the pipeline (None: a sink used on its own)."""

    def __init__(self, output: KafkaOutput, history: StagedHistory[KafkaCommittable] | None) -> None:
        self.output = output
        self.history = history

    def end(self, settings: KafkaSettings, admin: KafkaAdminClient, committable: KafkaCommittable | None) -> str:
        """End the output topic's hanging transactions this pipeline can show are its own and safe to abort.

        Raises, not retriable, naming each hanging transaction it must not end and the command that ends it;
        returns what it ended, for the task's log. Without the ledger's history it does nothing; without READ
        on the topic (DescribeProducers) it logs that it cannot look.
        """
        if self.history is None or self.output.guarantee != "EXACTLY_ONCE":
            return ""
        known = {} if committable is None else {r.held_transaction.producer_id: r.held_transaction.transactional_id
                                                for r in committable.transactions}
        live = LiveCluster(settings, admin)
        try:
            return self._end(settings, live, known)
        finally:
            live.close()

    def _end(self, settings: KafkaSettings, live: LiveCluster, known: dict[int, str]) -> str:
        topic = self.output.topic
        try:  # a node that died under the scan: asked again through a fresh client that sees the live brokers
            found = live.ask(f"looking for hanging transactions in {topic!r}", lambda admin: hanging.scan(
                admin, settings, [(topic, p) for p in range(probe.topic_partitions(admin, topic))], known))
        except (Errors.TopicAuthorizationFailedError, Errors.UnsupportedVersionError) as exc:
            log.warning("cannot look for hanging transactions in %r (%s): grant READ on the topic "
                        "(DescribeProducers) so that the pipeline finds and ends them itself", topic,
                        type(exc).__name__)
            return ""
        except Errors.KafkaError as exc:  # the cluster still does not answer: the task's retry asks again
            raise self.output.failure(settings, exc, f"looking for hanging transactions in {topic!r}") from exc
        if not found.hanging:
            return ""
        owners = self.owners()

        def visible(topic: str, partition: int, offset: int) -> bool | None:
            return probe.record_visible(settings, topic, partition, offset, timeout_s=5.0)

        reasons = {h: hanging.why_not_abort(h, owners.get(h.txn.producer_id), found.open_keys, visible)
                   for h in found.hanging}
        safe = [h for h, why in reasons.items() if why is None]
        refused = {h: why for h, why in reasons.items() if why is not None}
        servers = settings.bootstrap_servers
        try:
            ended = hanging.abort(live.admin, safe)
        except Errors.ClusterAuthorizationFailedError as exc:
            raise ConfigurationError(
                f"{len(safe)} hanging transaction(s) of this pipeline hold the output {topic!r} back "
                f"({'; '.join(h.describe() for h in safe)}), and ending them needs ALTER on the Cluster resource, "
                f"which {settings.principal} lacks ({exc}). Grant it (kafka-acls --add --allow-principal <principal> "
                "--operation Alter --cluster; docs/connections.md, ACLs) and retry, or end them yourself: "
                + "; ".join(h.txn.abort_command(servers) for h in safe),
                retriable=False) from exc
        for txn in ended:
            log.warning("ended a hanging transaction with an abort marker: %s", txn.describe())
        if refused:
            raise SinkError(
                f"hanging transaction(s) hold the output {topic!r} back (read_committed consumers see nothing "
                "after them) and the pipeline must not end them: "
                + "; ".join(f"{h.describe()}: not aborted because {why}" for h, why in refused.items())
                + ". Decide by hand; where aborting is right, run: "
                + "; ".join(h.txn.abort_command(servers) for h in refused)
                + ". Then clear this task.", retriable=False)
        return f"; ended {len(ended)} hanging transaction(s): " + "; ".join(t.describe() for t in ended)

    def owners(self) -> dict[int, hanging.Owner]:
        """The producer ids this pipeline's ledger recorded, with their batch's state and transactions."""
        owners: dict[int, hanging.Owner] = {}
        for batch, committable in (self.history() if self.history is not None else []):
            if not isinstance(committable, KafkaCommittable):
                continue
            writes = tuple((r.held_transaction.producer_id, t, p, o) for r in committable.transactions
                           for t, p, o in r.first_offsets if t == self.output.topic)
            owner = hanging.Owner(batch.seq, batch.state in (BatchState.COMMITTED, BatchState.RETRACTED), writes)
            owners.update({r.held_transaction.producer_id: owner for r in committable.transactions})
        return owners
