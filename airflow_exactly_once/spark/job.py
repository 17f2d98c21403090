"""The write step of a batch, run by Spark: read exactly the planned range, transform, pre-commit.

Runs in-process in the Airflow task (local mode) or as the main module of a
spark-submit (`python -m airflow_exactly_once.spark.job --batch-id ... --ledger-url ...`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, Callable

from airflow_exactly_once.core.config import PipelineConfig, resolve_transform
from airflow_exactly_once.core.errors import DataLossError, ExactlyOnceError, SourceUnavailableError, TransformError
from airflow_exactly_once.core.kafka_access import diagnose
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.write_report import record_failure
from airflow_exactly_once.sinks import create_sink
from airflow_exactly_once.spark.fence_watch import FenceWatch
from airflow_exactly_once.spark.parent_death import die_with_parent
from airflow_exactly_once.spark.runner import run_partition_writers

log = logging.getLogger(__name__)

# The ledger URL may hold a password: spark-submit passes it in the environment, not argv.
LEDGER_URL_ENV = "AIRFLOW_EXACTLY_ONCE_LEDGER_URL"
# The settings the ledger does not store (PipelineConfig.secrets()), likewise.
SECRETS_ENV = "AIRFLOW_EXACTLY_ONCE_SECRETS"
EXIT_RETRIABLE, EXIT_FOR_GOOD = 1, 3


def kafka_read_options(batch: Batch, config: PipelineConfig) -> dict[str, str]:
    """Options of Spark's Kafka batch source for exactly the batch's non-empty ranges."""
    ranges = [r for r in batch.ranges if r.size > 0]
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    assign: dict[str, list[int]] = {}
    for r in ranges:
        assign.setdefault(r.topic, []).append(r.partition)
        starting.setdefault(r.topic, {})[str(r.partition)] = r.start
        ending.setdefault(r.topic, {})[str(r.partition)] = r.end
    options = {
        **config.kafka().spark_source_options(),
        "assign": json.dumps(assign),
        "startingOffsets": json.dumps(starting),
        "endingOffsets": json.dumps(ending),
        "kafka.isolation.level": "read_committed",
        # A planned offset that is gone must fail the batch, never be skipped silently.
        "failOnDataLoss": "true",
    }
    return options


def read_batch(spark, batch: Batch, config: PipelineConfig):
    return spark.read.format("kafka").options(**kafka_read_options(batch, config)).load()


def apply_transform(transform, frame):
    from pyspark.sql import DataFrame

    if transform is None:
        return frame
    try:
        result = transform(frame)
    except Exception as exc:
        raise TransformError(f"the transform {getattr(transform, '__name__', transform)!r} raised "
                             f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(result, DataFrame):
        raise TransformError(f"the transform {getattr(transform, '__name__', transform)!r} returned "
                             f"{type(result).__name__}, not a pyspark.sql.DataFrame; it must take a DataFrame "
                             "and return one")
    return result


def run_write(spark, coordinator: BatchCoordinator, batch_id: BatchId, transform=None,
              on_claimed: Callable[[Batch], None] | None = None) -> dict[str, Any]:
    """Claim, read, transform, pre-commit, mark PREPARED. Returns a summary for the task log.

    `on_claimed` sees the claimed batch (its epoch) before any data is read.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    config = coordinator.config
    batch = coordinator.claim(batch_id)
    if batch is None:
        current = coordinator.ledger.get_batch(batch_id)
        return {"batch": str(batch_id), "action": "skipped", "state": current.state.value,
                "message": f"batch {batch_id} is already {current.state.value}; nothing to write"}
    if on_claimed is not None:
        on_claimed(batch)
    transform = resolve_transform(transform if transform is not None else config.transform)
    seen_in, seen_out = Observation("input"), Observation("output")
    source = read_batch(spark, batch, config).observe(seen_in, F.count(F.lit(1)).alias("records"))
    output = apply_transform(transform, source).observe(seen_out, F.count(F.lit(1)).alias("records"))
    try:
        committable = coordinator.sink.stage(output, batch, run_partition_writers)
    except Exception as exc:
        raise _explain_spark_failure(exc, config) from exc
    input_records = seen_in.get.get("records", 0)
    output_records = seen_out.get.get("records", 0)
    prepared = coordinator.prepare(batch, committable, input_records, output_records)
    return {"batch": str(batch_id), "action": "prepared", "state": prepared.state.value,
            "input_records": input_records, "output_records": output_records, "attempt": f"e{batch.epoch}"}


def _explain_spark_failure(exc: Exception, config: PipelineConfig) -> Exception:
    text = str(exc)
    if isinstance(exc, ExactlyOnceError):  # already says what went wrong (e.g. a sink's SinkError)
        return exc
    # Spark's Java client names its problem (SaslAuthenticationException, PKIX path building failed,
    # TopicAuthorizationException): the settings say which of them to change.
    settings = config.kafka()
    explained = settings.explain(text, topics=config.topics, topic_operations="READ and DESCRIBE")
    if explained is not None:
        return explained
    if "OffsetOutOfRange" in text or "Cannot fetch offset" in text or "data loss" in text.lower():
        return DataLossError(f"Spark could not read the planned offsets (deleted by retention or topic "
                             f"recreated since planning): {text[:500]}. Nothing was committed; the next run "
                             "re-plans and applies data_loss_policy.")
    if "TimeoutException" in text or "Timed out" in text:
        diagnosis = diagnose(settings)  # e.g. security.protocol does not match the listener: the client only waits
        if diagnosis.error is not None:
            return diagnosis.error
        return SourceUnavailableError(f"Spark could not reach Kafka at {config.bootstrap_servers} (now: "
                                      f"{diagnosis.detail}): {text[:500]}")
    if "AnalysisException" in type(exc).__name__ or "AnalysisException" in text[:200]:
        return TransformError(f"the transformed DataFrame could not be written: {text[:800]}")
    return exc


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: only the batch id and the ledger location travel.

    Exits 0 when the batch is PREPARED (or was already past the write); otherwise records
    why in the ledger (see core.write_report) and exits 3 when a retry cannot help, else 1.
    """
    parser = argparse.ArgumentParser(prog="airflow_exactly_once.spark.job")
    parser.add_argument("--batch-id", required=True)
    parser.add_argument("--ledger-url", default=os.environ.get(LEDGER_URL_ENV),
                        help=f"SQLAlchemy URL of the ledger (default: ${LEDGER_URL_ENV})")
    args = parser.parse_args(argv)
    if not args.ledger_url:
        parser.error(f"no ledger: pass --ledger-url or set {LEDGER_URL_ENV}")
    logging.basicConfig(level=logging.INFO)
    die_with_parent()  # the JVM that spark-submit started us from
    from pyspark.sql import SparkSession

    batch_id = BatchId.parse(args.batch_id)
    ledger = Ledger(args.ledger_url)
    ledger.create_schema()  # idempotent; an empty database then says "not in the ledger" below
    pipeline = ledger.pipeline(batch_id.pipeline_id)
    if pipeline is None:
        log.error("pipeline %s is not in the ledger at the given URL; was the batch planned there?",
                  batch_id.pipeline_id)
        return EXIT_FOR_GOOD
    config = PipelineConfig.from_dict(pipeline["config"]).with_secrets(json.loads(os.environ.get(SECRETS_ENV) or "{}"))
    coordinator = BatchCoordinator(config, ledger, create_sink(config.sink))
    spark = SparkSession.builder.appName(f"exactly-once {batch_id}").getOrCreate()
    watch = FenceWatch(ledger, batch_id, on_fenced=lambda _reason: spark.sparkContext.cancelAllJobs())
    try:
        summary = run_write(spark, coordinator, batch_id, on_claimed=watch.start)
    except Exception as exc:
        error = watch.explain(exc)
        log.exception("the write of batch %s failed: %s", batch_id, error)
        record_failure(ledger, batch_id, error, watch.epoch)
        retriable = error.retriable if isinstance(error, ExactlyOnceError) else True
        return EXIT_RETRIABLE if retriable else EXIT_FOR_GOOD
    finally:
        watch.stop()
        spark.stop()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
