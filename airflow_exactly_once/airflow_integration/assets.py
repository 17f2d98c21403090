"""Airflow Asset events for committed batches: downstream DAGs can be scheduled on a pipeline.

Each pipeline is the Asset `x-exactly-once://<pipeline_id>`. The tasks that commit batches
(notify_complete, and plan when its recovery commits a batch left by an earlier run) carry
the AssetAlias `exactly-once-batches` as outlet and add one event per committed batch, with
its counts and offsets as extra. An alias, because pipeline ids are often templated and only
known when the task runs.
"""

from __future__ import annotations

from typing import Any, Iterable

from airflow_exactly_once.airflow_integration.compat import Asset, AssetAlias, AssetWatcher
from airflow_exactly_once.core.lineage_names import pipeline_asset_uri
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.timestamps import iso

__all__ = ["pipeline_asset", "pipeline_backlog_asset"]

ALIAS_NAME = "exactly-once-batches"
GROUP = "exactly-once"


def pipeline_asset(pipeline_id: str) -> Asset:
    """The Asset a DAG can be scheduled on to run after each committed batch of `pipeline_id`."""
    return Asset(name=f"exactly-once/{pipeline_id}", uri=pipeline_asset_uri(pipeline_id), group=GROUP)


def pipeline_backlog_asset(pipeline_id: str, trigger: Any) -> Asset:
    """The Asset to schedule a pipeline's DAG on so that it runs when records wait (event-driven scheduling).

    `trigger` is its watcher's trigger, e.g. a triggers.backlog.PipelineBacklogTrigger of the same pipeline.
    """
    return Asset(name=f"exactly-once/{pipeline_id}/backlog", uri=f"x-exactly-once-backlog://{pipeline_id}",
                 group=GROUP, watchers=[AssetWatcher(name=f"{pipeline_id}-backlog", trigger=trigger)])


def batches_alias() -> AssetAlias:
    return AssetAlias(name=ALIAS_NAME, group=GROUP)


def batch_event_extra(batch: Batch, interval: tuple[int, int] | None = None) -> dict[str, Any]:
    """What a committed batch's Asset event says: which records, how many, from where."""
    extra: dict[str, Any] = {
        "pipeline_id": batch.pipeline_id,
        "batch_seq": batch.seq,
        "run_id": batch.run_id,
        "state": batch.state.value,
        "input_records": batch.input_records,
        "output_records": batch.output_records,
        "ranges": [r.as_dict() for r in batch.ranges],
    }
    if interval is not None:
        extra["interval"] = {"start": iso(interval[0]), "end": iso(interval[1])}
    if batch.bad_records:
        extra["bad_records"] = batch.bad_records.count
        extra["bad_record_policy"] = batch.bad_records.policy
    if batch.replaces is not None:
        extra["replaces_batch"] = batch.replaces
    return extra


def emit_batch_events(context: Any, outlets: Iterable[Any], events: list[dict[str, Any]]) -> int:
    """Attach one event per committed batch to the task's outlets; returns how many were added."""
    added = 0
    for outlet in outlets or ():
        if isinstance(outlet, AssetAlias):
            for extra in events:
                context["outlet_events"][outlet].add(pipeline_asset(extra["pipeline_id"]), extra=extra)
                added += 1
        elif isinstance(outlet, Asset) and events:
            context["outlet_events"][outlet].extra = events[-1]
            added += 1
    return added
