"""The write step of a batch, run by Spark: read exactly the planned range, transform, pre-commit.

Runs in-process in the Airflow task (local mode) or as the main module of a
spark-submit (`python -m airflow_exactly_once.spark.job --batch-id ... --ledger-url ...`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from airflow_exactly_once.core.config import PipelineConfig, resolve_transform
from airflow_exactly_once.core.errors import ExactlyOnceError, SourceUnavailableError, TransformError
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.sinks import create_sink

log = logging.getLogger(__name__)


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
        "kafka.bootstrap.servers": config.bootstrap_servers,
        "assign": json.dumps(assign),
        "startingOffsets": json.dumps(starting),
        "endingOffsets": json.dumps(ending),
        "kafka.isolation.level": "read_committed",
        # A planned offset that is gone must fail the batch, never be skipped silently.
        "failOnDataLoss": "true",
    }
    for key, value in (config.kafka_config or {}).items():
        options[f"kafka.{key.replace('_', '.')}"] = str(value)
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


def run_write(spark, coordinator: BatchCoordinator, batch_id: BatchId, transform=None) -> dict[str, Any]:
    """Claim, read, transform, pre-commit, mark PREPARED. Returns a summary for the task log."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    config = coordinator.config
    batch = coordinator.begin_write(batch_id)
    if batch is None:
        current = coordinator.ledger.get_batch(batch_id)
        return {"batch": str(batch_id), "action": "skipped", "state": current.state.value,
                "message": f"batch {batch_id} is already {current.state.value}; nothing to write"}
    transform = resolve_transform(transform if transform is not None else config.transform)
    seen_in, seen_out = Observation("input"), Observation("output")
    source = read_batch(spark, batch, config).observe(seen_in, F.count(F.lit(1)).alias("records"))
    output = apply_transform(transform, source).observe(seen_out, F.count(F.lit(1)).alias("records"))
    attempt = f"e{batch.epoch}"
    try:
        handles = coordinator.sink.prepare(output, batch, attempt)
    except Exception as exc:
        raise _explain_spark_failure(exc, config) from exc
    input_records = seen_in.get.get("records", 0)
    output_records = seen_out.get.get("records", 0)
    handles["records"] = output_records
    prepared = coordinator.finish_write(batch, handles, input_records, output_records)
    return {"batch": str(batch_id), "action": "prepared", "state": prepared.state.value,
            "input_records": input_records, "output_records": output_records, "attempt": attempt}


def _explain_spark_failure(exc: Exception, config: PipelineConfig) -> Exception:
    text = str(exc)
    if isinstance(exc, ExactlyOnceError):  # already says what went wrong (e.g. a sink's SinkError)
        return exc
    if "OffsetOutOfRange" in text or "Cannot fetch offset" in text or "data loss" in text.lower():
        from airflow_exactly_once.core.errors import DataLossError

        return DataLossError(f"Spark could not read the planned offsets (deleted by retention or topic "
                             f"recreated since planning): {text[:500]}. Nothing was committed; the next run "
                             "re-plans and applies data_loss_policy.")
    if "TimeoutException" in text or "Timed out" in text:
        return SourceUnavailableError(f"Spark could not reach Kafka at {config.bootstrap_servers}: {text[:500]}")
    if "AnalysisException" in type(exc).__name__ or "AnalysisException" in text[:200]:
        return TransformError(f"the transformed DataFrame could not be written: {text[:800]}")
    return exc


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: only the batch id and the ledger location travel."""
    parser = argparse.ArgumentParser(prog="airflow_exactly_once.spark.job")
    parser.add_argument("--batch-id", required=True)
    parser.add_argument("--ledger-url", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    from pyspark.sql import SparkSession

    batch_id = BatchId.parse(args.batch_id)
    ledger = Ledger(args.ledger_url)
    pipeline = ledger.pipeline(batch_id.pipeline_id)
    config = PipelineConfig.from_dict(pipeline["config"])
    coordinator = BatchCoordinator(config, ledger, create_sink(config.sink))
    spark = SparkSession.builder.appName(f"exactly-once {batch_id}").getOrCreate()
    summary = run_write(spark, coordinator, batch_id)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
