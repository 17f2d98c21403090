"""The write step of a batch, run by Spark: read exactly the planned range, transform, pre-commit.

Runs in-process in the Airflow task (local mode) or as the main module of a
spark-submit (`python -m airflow_exactly_once.spark.write_job --batch-id ... --ledger-url ...`).
How the batch is read is spark.batch_read's, how its records are counted spark.observed_counts', and
what a failure means spark.write_failures'; the report it returns is spark.write_report's.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from sqlalchemy.engine import make_url

from airflow_exactly_once.core.claim import ClaimCheck
from airflow_exactly_once.core.config import PipelineConfig, resolve_transform
from airflow_exactly_once.core.errors import ExactlyOnceError, TransformError, raise_explained
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.protocol import BatchCoordinator
from airflow_exactly_once.core.secrets import redacted_value
from airflow_exactly_once.core.sink_writer import SinkWriter
from airflow_exactly_once.core.write_report import record_failure
from airflow_exactly_once.records.bad_records import BadRecordCounts, check_counts
from airflow_exactly_once.records.registry import Registry, add_found_ids, part_schemas
from airflow_exactly_once.sinks import pipeline_committer, pipeline_writer
from airflow_exactly_once.spark import records
from airflow_exactly_once.spark.batch_read import is_connect, read_batch, read_layout
from airflow_exactly_once.spark.fence_watch import FenceWatch
from airflow_exactly_once.spark.in_process_session import drop_stale_connect_mode
from airflow_exactly_once.spark.observed_counts import counted, observe_on_connect, observed_already, observed_records
from airflow_exactly_once.spark.parent_death import die_with_parent
from airflow_exactly_once.spark.partition_writers import run_partition_writers
from airflow_exactly_once.spark.write_failures import explain_spark_failure
from airflow_exactly_once.spark.write_report import WriteReport, skipped

log = logging.getLogger(__name__)

# spark-submit passes the ledger URL in the environment, without its password (a cluster shows a driver's
# environment in Spark's UI, e.g. as spark.yarn.appMasterEnv.*) ...
LEDGER_URL_ENV = "AIRFLOW_EXACTLY_ONCE_LEDGER_URL"
# ... and, under a name Spark's UI redacts (spark.redaction.regex matches "secret"), what the ledger does not
# store: {"config": PipelineConfig.secrets(), "ledger_password": the ledger URL's password}.
SECRETS_ENV = "AIRFLOW_EXACTLY_ONCE_SECRETS"
EXIT_RETRIABLE, EXIT_FOR_GOOD = 1, 3
FIRST_BAD = 5  # bad records named in an error or kept in the ledger


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
              on_claimed: Callable[[Batch], None] | None = None, writer: SinkWriter | None = None) -> WriteReport:
    """Claim, read, decode, transform, pre-commit, mark PREPARED. Returns the write's report (spark.write_report).

    `writer` stages (default: the pipeline's sink writer, bound to the coordinator's committer, which takes
    away what a failed stage left). `on_claimed` sees the claimed batch (its epoch) before any data is read.
    Without decoding and without records marked bad by the transform, the output is staged straight away
    (the record counts come from observations); otherwise bad records are counted first and follow the
    pipeline's bad_record_policy (see spark.records and records.bad_records).
    """
    config = coordinator.config
    if writer is None:
        writer = pipeline_writer(config).bind(config, coordinator.sink)
    batch = coordinator.claim(batch_id)
    if batch is None:
        return skipped(batch_id, coordinator.ledger.get_batch(batch_id).state, "write")
    if on_claimed is not None:
        on_claimed(batch)
    transform = resolve_transform(transform if transform is not None else config.transform)
    try:
        staged = _stage(spark, coordinator, writer, batch, transform)
    except Exception as exc:
        raise_explained(explain_spark_failure(exc, config), exc)
    prepared = coordinator.prepare(batch, staged.committable, staged.input_records, staged.output_records,
                                   details=staged.details)
    report: WriteReport = {"batch": str(batch_id), "action": "prepared", "state": prepared.state.value,
                           "input_records": staged.input_records, "output_records": staged.output_records,
                           "attempt": f"e{batch.epoch}"}
    if prepared.bad_records:
        report["bad_records"] = prepared.bad_records.count
    return report


@dataclass
class _Staged:
    committable: Any
    input_records: int | None
    output_records: int | None
    details: dict[str, Any] | None = None


def _stage(spark, coordinator: BatchCoordinator, writer: SinkWriter, batch: Batch, transform) -> _Staged:
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    config = coordinator.config
    run_writers = partial(run_partition_writers, claim=ClaimCheck(coordinator.ledger.url, batch.id, batch.epoch))
    # Observations sit outside our own columns: Spark does not prune columns through them, so an
    # observation above `_source` would copy every key and value once more.
    seen_in, seen_out = Observation("input"), Observation("output")
    batch_input = read_batch(spark, batch, config, read_layout(spark, batch, writer))
    source = batch_input.frame
    checks_decoding = records.checks_decoding(config)
    if is_connect(spark):
        observe_on_connect(spark)
    # Else _count counts the input; the dead letters of undecodable and of marked records are a union of two
    # branches of this plan, which Spark Connect refuses when both carry the same observation ("multiple values
    # for keyword argument 'input'"). A small batch read here needs no count: its rows were counted as read.
    observes_input = not checks_decoding and batch_input.records is None
    if observes_input:
        source = counted(source, seen_in)
    if checks_decoding:  # one pass when the batch turns out to have no bad record
        staged = _stage_if_all_good(source, coordinator, writer, batch, transform, run_writers)
        if staged is not None:
            return staged
    if checks_decoding:  # read Kafka once: counted, then the good and the bad records written from the cache
        decoded = _decoded_once(records.with_source(source), config)
    else:
        decoded = records.decode(records.with_source(source), config)
    good_input = decoded.filter(F.col(records.DECODE_ERROR).isNull()).drop(records.DECODE_ERROR) \
        if checks_decoding else decoded
    output = apply_transform(transform, good_input)
    marks = records.BAD_RECORD in output.columns
    try:
        if not (checks_decoding or marks):  # the fast path: no bad records possible, nothing counted first
            staged = counted(records.without_internal(output), seen_out)
            committable = writer.stage(staged, batch, run_writers)
            output_records = observed_records(seen_out)
            input_records = batch_input.records if batch_input.records is not None else observed_records(seen_in)
            # A count Spark did not report: the staged output may know its own, and without a transform the input
            # is the output record for record; else the input is counted again, a second read of the range.
            if output_records is None:
                output_records = committable.records
            if input_records is None:
                input_records = output_records if transform is None else \
                    read_batch(spark, batch, config).frame.count()
            return _Staged(committable, input_records, output_records)
        if marks:
            if records.SOURCE not in output.columns:
                raise TransformError(f"the transform marks bad records ({records.BAD_RECORD}) but dropped the "
                                     f"{records.SOURCE} column: keep it (select('*', ...) does), the dead letters "
                                     "are made from it")
            output = output.persist()
        counts, good = _count(decoded, output, checks_decoding, marks)
        check_counts(config, counts, str(batch.id))
        bad = None
        if counts.bad and config.bad_record_policy == "dead_letter":
            parts = []
            if counts.undecodable:
                parts.append(records.dead_letters(decoded.filter(F.col(records.DECODE_ERROR).isNotNull()),
                                                  records.DECODE_ERROR, str(batch.id), batch.pipeline_id))
            if counts.marked_by_transform:
                parts.append(records.dead_letters(output.filter(F.col(records.BAD_RECORD).isNotNull()),
                                                  records.BAD_RECORD, str(batch.id), batch.pipeline_id))
            bad = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        good_output = output.filter(F.col(records.BAD_RECORD).isNull()) if marks else output
        committable = writer.stage_batch(records.without_internal(good_output), bad, batch, run_writers)
        details = counts.details(config.bad_record_policy) if counts.bad else None
        return _Staged(committable, counts.input_records, good, details)
    finally:
        if marks:
            output.unpersist()
        if checks_decoding:
            decoded.unpersist()


def _stage_if_all_good(source, coordinator: BatchCoordinator, writer: SinkWriter, batch: Batch, transform,
                       run_writers) -> _Staged | None:
    """Decode, transform and stage in one pass, counting the input and the output with Observations.

    Most batches have no bad record: then this is the whole write, without the cache the policy path
    decodes into (about twice as fast). The first bad record fails its Spark task
    (records.failing_at_bad_record): the attempt's staged output is aborted and None sends the batch down
    the policy path, which counts before it stages anything and writes the dead letters; so do records
    the transform marks, and a count Spark did not report.
    """
    from pyspark.sql import Observation

    config, committer = coordinator.config, coordinator.sink
    seen_in, seen_out = Observation("input"), Observation("good")
    # Kafka's own rows: the source is not pruned (it always reads every column), so observing them copies nothing
    observed = counted(source, seen_in)
    decoded = records.decode(observed, config, _registry_schemas(config))
    try:
        output = apply_transform(transform, records.with_source(records.failing_at_bad_record(decoded)))
    except TransformError as exc:
        if records.found_bad_record(exc):  # an action of the transform's own met one: nothing is staged yet
            return None
        raise
    if records.BAD_RECORD in output.columns:  # marked records: counted before anything is staged
        return None
    if observed_already(seen_in):  # the transform ran an action of its own, maybe on part of the batch:
        return None  # the counts must come from the whole batch, so the policy path counts them
    try:
        committable = writer.stage_batch(counted(records.without_internal(output), seen_out), None, batch,
                                         run_writers)
    except Exception as exc:
        if not records.found_bad_record(exc):
            raise
        log.info("batch %s has bad records: the write that met the first is aborted (%s), the bad-record policy "
                 "decides", batch.id, committer.abort(batch, None))
        return None
    input_records, good = observed_records(seen_in), observed_records(seen_out)
    if input_records is not None and good is not None:
        return _Staged(committable, input_records, good)
    log.info("Spark reported no count for batch %s: its staged output is aborted, the policy path counts",
             batch.id)
    committer.abort(batch, committable)
    return None


def _decoded_once(source, config: PipelineConfig):
    """The batch decoded and cached. In a registry format the schemas come first (records.registry); ids that
    the subjects' versions did not hold are looked up once the records are read, and when the registry knows
    one, the batch is decoded again with it (an id it does not know stays a bad record's reason)."""
    schemas = _registry_schemas(config)
    decoded = records.decode(source, config, schemas).persist()
    if not schemas:
        return decoded
    registry = Registry(config)  # the schemas' writers are cached per process: no second fetch
    if any([add_found_ids(part, records.unknown_ids(decoded, part.part), registry) for part in schemas.values()]):
        decoded.unpersist()
        decoded = records.decode(source, config, schemas).persist()
    return decoded


def _registry_schemas(config: PipelineConfig) -> dict[str, Any]:
    """The registry formats' reader and writer schemas per part (value, key); empty for other formats."""
    parts = [part for part in ("value", "key") if config.uses_registry(part)]
    if not parts:
        return {}
    registry = Registry(config)
    return {part: part_schemas(config, part, registry) for part in parts}


def _count(decoded, output, checks_decoding: bool, marks: bool) -> tuple[BadRecordCounts, int]:
    """Input and bad records, the first bad ones, and the good records of the output (queries on the cache)."""
    from pyspark.sql import functions as F

    def first(frame, error: str) -> list[dict[str, Any]]:
        rows = frame.filter(F.col(error).isNotNull()).select(
            F.col(f"{records.SOURCE}.topic").alias("topic"), F.col(f"{records.SOURCE}.partition").alias("partition"),
            F.col(f"{records.SOURCE}.offset").alias("offset"), F.col(error).alias("error"),
            F.col(f"{records.SOURCE}.value").alias("value")).limit(FIRST_BAD).collect()
        return [row.asDict() for row in rows]

    if checks_decoding:
        row = decoded.agg(F.count(F.lit(1)).alias("n"), F.count(records.DECODE_ERROR).alias("bad")).collect()[0]
        counts = BadRecordCounts(row["n"], undecodable=row["bad"])
        if counts.undecodable:
            counts.first += first(decoded, records.DECODE_ERROR)
    else:
        counts = BadRecordCounts(decoded.count())
    if marks:
        row = output.agg(F.count(F.lit(1)).alias("n"), F.count(records.BAD_RECORD).alias("bad")).collect()[0]
        counts.marked_by_transform = row["bad"]
        if counts.marked_by_transform and len(counts.first) < FIRST_BAD:
            counts.first += first(output, records.BAD_RECORD)[:FIRST_BAD - len(counts.first)]
        return counts, row["n"] - row["bad"]
    return counts, output.count()



def secrets_environment(ledger_url: str, config: PipelineConfig | None) -> dict[str, str]:
    """The environment that brings the ledger's location and a config's secrets to the job (see main)."""
    url = make_url(ledger_url)
    secrets = {"config": config.secrets() if config is not None else [], "ledger_password": url.password}
    return {LEDGER_URL_ENV: redacted_value(ledger_url) if url.password else ledger_url,
            SECRETS_ENV: json.dumps(secrets)}


def _from_environment(ledger_url: str) -> tuple[str, list[list[Any]]]:
    """The ledger URL made whole and the config's secrets, from what secrets_environment() set."""
    secrets = json.loads(os.environ.get(SECRETS_ENV) or "{}")
    password = secrets.get("ledger_password")
    if password:
        ledger_url = make_url(ledger_url).set(password=password).render_as_string(hide_password=False)
    return ledger_url, secrets.get("config") or []


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: only the batch id and the ledger location travel.

    Exits 0 when the batch is PREPARED (or was already past the write); otherwise records
    why in the ledger (see core.write_report) and exits 3 when a retry cannot help, else 1.
    """
    parser = argparse.ArgumentParser(prog="airflow_exactly_once.spark.write_job")
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
    ledger_url, secrets = _from_environment(args.ledger_url)
    ledger = Ledger(ledger_url)
    ledger.create_schema()  # idempotent; an empty database then says "not in the ledger" below
    pipeline = ledger.pipeline(batch_id.pipeline_id)
    if pipeline is None:
        log.error("pipeline %s is not in the ledger at the given URL; was the batch planned there?",
                  batch_id.pipeline_id)
        return EXIT_FOR_GOOD
    config = PipelineConfig.from_dict(pipeline["config"]).with_secrets(secrets)
    coordinator = BatchCoordinator(config, ledger, pipeline_committer(config))
    drop_stale_connect_mode()  # a Spark Connect mark inherited from the process that submitted the job
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
