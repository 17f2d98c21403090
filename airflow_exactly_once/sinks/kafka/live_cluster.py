"""Asking a Kafka cluster while one of its nodes may have just died.

kafka-python's admin client routes by what it cached: the brokers of its bootstrap metadata (ListTransactions
goes to each of them) and the coordinator FindCoordinator once named (DescribeTransactions). After a node is
SIGKILLed both keep pointing at the dead node until `metadata.max.age.ms`, so asking again through the same
client fails the same way. Here a question that failed because a node did not answer (or no longer leads or
coordinates) is asked again, after a pause, through a fresh admin client bootstrapped from the bootstrap servers:
fresh metadata (the controller drops a node from it once it fences it, after `broker.session.timeout.ms`), no
cached coordinators, and leaders looked up again. Errors that say something about the question itself (no ACL,
an unknown topic) are raised at once.
"""

from __future__ import annotations

import logging
from typing import Callable, TypeVar

import kafka.errors as Errors
from kafka import KafkaAdminClient

from airflow_exactly_once.kafka.liveness import PATIENCE_S, ask_around, node_unreachable
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks.kafka import probe

__all__ = ["LiveCluster", "node_unreachable"]

log = logging.getLogger(__name__)

Answer = TypeVar("Answer")


class LiveCluster:
    """One caller's admin client, replaced by a fresh one from the bootstrap servers when a node did not answer.

    The caller's client is never closed here; the fresh ones are, by `close`.
    """

    def __init__(self, settings: KafkaSettings, admin: KafkaAdminClient, patience_s: float = PATIENCE_S,
                 new_admin: Callable[[KafkaSettings], KafkaAdminClient] | None = None) -> None:
        self.settings = settings
        self.admin = admin
        self.patience_s = patience_s
        self._new_admin = new_admin or probe.new_admin_client  # looked up now: a test may stand in for it
        self._own: KafkaAdminClient | None = None

    def ask(self, what: str, question: Callable[[KafkaAdminClient], Answer]) -> Answer:
        """`question`'s answer; asked again through a fresh client while nodes do not answer, up to `patience_s`
        (kafka.liveness.ask_around). Raises the last error when the cluster still does not answer after that, and
        any other error at once.
        """
        return ask_around(what, lambda: question(self.admin), self.patience_s, between=self._renew)

    def _renew(self) -> None:
        """A fresh client; when no bootstrap server answers now, the next question fails and is asked again."""
        try:
            fresh = self._new_admin(self.settings)
        except Errors.KafkaError as exc:
            log.info("no fresh admin client of %s yet: %s", self.settings.bootstrap_servers, exc)
            return
        self.close()
        self._own = self.admin = fresh

    def __enter__(self) -> "LiveCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None
