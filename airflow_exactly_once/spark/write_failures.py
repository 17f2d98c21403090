"""What a failed write's Spark error means, as the error that says what to do: a settings or ACL problem,
offsets gone since planning, Spark without its Kafka connector, a cluster out of reach, a transform's output
that cannot be written.

Spark hands on what its Kafka client or its analyzer said as text; the write (spark.write_job) raises what
explain_spark_failure makes of it, and a Spark Connect server's session asks lacks_kafka_connector too.
"""

from __future__ import annotations

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import (
    ConfigurationError,
    DataLossError,
    ExactlyOnceError,
    SourceUnavailableError,
    TransformError,
)
from airflow_exactly_once.kafka.access import diagnose, explain_refusal
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.spark.packages import kafka_package


def lacks_kafka_connector(text: str) -> bool:
    """Whether a Spark error says that Spark's Kafka data source is not on its classpath."""
    return "data source: kafka" in text or ("DATA_SOURCE_NOT_FOUND" in text and "kafka" in text)


def explain_spark_failure(exc: Exception, config: PipelineConfig) -> Exception:
    text = str(exc)
    if isinstance(exc, ExactlyOnceError):  # already says what went wrong (e.g. a sink's SinkError)
        return exc
    # Spark's Java client names its problem (SaslAuthenticationException, PKIX path building failed,
    # TopicAuthorizationException): the settings say which of them to change.
    settings = KafkaSettings.of(config)
    explained = explain_refusal(settings, text, topics=config.topics, topic_operations="READ and DESCRIBE",
                                topic_pattern=config.topic_pattern)
    if explained is not None:
        return explained
    if "OffsetOutOfRange" in text or "Cannot fetch offset" in text or "data loss" in text.lower():
        return DataLossError(f"Spark could not read the planned offsets (deleted by retention or topic "
                             f"recreated since planning): {text[:500]}. Nothing was committed; the next run "
                             "re-plans and applies data_loss_policy.")
    if lacks_kafka_connector(text):
        return ConfigurationError(f"Spark cannot load its Kafka connector (data source 'kafka' not found): give "
                                  f"Spark the connector, e.g. spark.jars.packages={kafka_package()}, or on a Spark "
                                  "Connect server --packages with that package")
    if "TimeoutException" in text or "Timed out" in text:
        diagnosis = diagnose(settings)  # e.g. security.protocol does not match the listener: the client only waits
        if diagnosis.error is not None:
            return diagnosis.error
        return SourceUnavailableError(f"Spark could not reach Kafka at {config.bootstrap_servers} (now: "
                                      f"{diagnosis.detail}): {text[:500]}")
    if "AnalysisException" in type(exc).__name__ or "AnalysisException" in text[:200]:
        return TransformError(f"the transformed DataFrame could not be written: {text[:800]}")
    return exc
