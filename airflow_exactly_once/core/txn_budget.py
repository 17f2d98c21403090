"""The transaction timeout guardrail: can a pre-committed transaction live until it is committed?

A Kafka transaction is opened by the write attempt and committed by notify_complete,
possibly after several notify_complete retries. If the broker times it out first, the
batch is found lost and processed again: correct, but wasted work, and a timeout shorter
than the DAG's own retry schedule makes that the normal case. So `plan` refuses such a
setting up front and says which number to change. Pure: the operator reads the numbers
from Airflow, the sink reads the broker's maximum from Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_exactly_once.core.errors import ConfigurationError

# Airflow's own ceiling for one retry delay (airflow.sdk...abstractoperator.MAX_RETRY_DELAY).
AIRFLOW_MAX_RETRY_DELAY_S = 24 * 60 * 60


@dataclass(frozen=True)
class RetryBudget:
    """The retry settings of one Airflow task, in seconds."""

    task_id: str
    retries: int
    retry_delay_s: float
    execution_timeout_s: float | None
    exponential_backoff: bool = False
    max_retry_delay_s: float | None = None

    def delays(self) -> list[float]:
        """Upper bound of each wait between attempts (Airflow's backoff draws at most twice the base)."""
        cap = self.max_retry_delay_s or AIRFLOW_MAX_RETRY_DELAY_S
        if not self.exponential_backoff:
            return [min(self.retry_delay_s, cap)] * self.retries
        return [min(2 * self.retry_delay_s * 2 ** n, cap) for n in range(self.retries)]

    def describe_wait(self) -> str:
        kind = "exponential retry_delay" if self.exponential_backoff else "retry_delay"
        return f"{self.retries} x {kind} {self.retry_delay_s:g} s" if self.retries else "no retries"


def check_broker_maximum(transaction_timeout_ms: int, broker_max_ms: int) -> None:
    """The broker refuses transactions longer than its transaction.max.timeout.ms."""
    if transaction_timeout_ms > broker_max_ms:
        raise ConfigurationError(
            f"transaction_timeout_ms={transaction_timeout_ms} of the kafka sink is above the brokers' "
            f"transaction.max.timeout.ms={broker_max_ms}, so Kafka would refuse every transaction. "
            f"Lower the sink's transaction_timeout_ms to at most {broker_max_ms}, or raise "
            "transaction.max.timeout.ms on the brokers.")


def check_transaction_timeout(transaction_timeout_ms: int, write: RetryBudget | None,
                              notify: RetryBudget | None) -> list[str]:
    """Raise if a transaction can time out while the DAG still plans to commit it; return warnings.

    The longest life of a transaction: the write attempt that opened it (a retried write
    opens new ones), then every notify_complete attempt and the waits between them.
    """
    warnings: list[str] = []
    for name, param, task in (("write", "write_task_id", write), ("notify_complete", "notify_task_id", notify)):
        if task is None:
            warnings.append(f"plan does not know this pipeline's {name} task (the task group tells it; wired by "
                            f"hand, give PlanBatchOperator {param}=...), so its retry settings could not be "
                            "checked against transaction_timeout_ms")
        elif task.execution_timeout_s is None:
            warnings.append(f"task {task.task_id} has no execution_timeout, so how long it runs is unbounded "
                            f"and only its retry delays were checked against transaction_timeout_ms; set "
                            f"execution_timeout on it")
    terms: list[tuple[str, float]] = []
    if write is not None and write.execution_timeout_s:
        terms.append((f"{write.task_id} execution_timeout", write.execution_timeout_s))
    if notify is not None:
        if notify.execution_timeout_s:
            terms.append((f"{notify.retries + 1} x {notify.task_id} execution_timeout",
                          (notify.retries + 1) * notify.execution_timeout_s))
        if notify.retries:
            terms.append((f"{notify.task_id} {notify.describe_wait()}", sum(notify.delays())))
    needed_s = sum(seconds for _, seconds in terms)
    if needed_s * 1000 >= transaction_timeout_ms:
        spelled = " + ".join(f"{label} ({seconds:g} s)" for label, seconds in terms)
        raise ConfigurationError(
            f"transaction_timeout_ms={transaction_timeout_ms} of the kafka sink is too short for this DAG's retry "
            f"settings: a pre-committed transaction must stay open until notify_complete commits it, which can "
            f"take {needed_s:g} s here ({spelled}). Raise the sink's transaction_timeout_ms above "
            f"{int(needed_s * 1000)} (within the brokers' transaction.max.timeout.ms), or lower "
            f"{notify.task_id if notify else 'notify_complete'}'s retries, retry_delay or execution_timeout.")
    return warnings
