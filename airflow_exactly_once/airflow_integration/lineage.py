"""OpenLineage for a pipeline's tasks: which topics a batch reads, where it writes, which offsets.

The operators' get_openlineage_facets_on_start / _on_complete / _on_failure (the OpenLineage
provider's DefaultExtractor calls them, only where the provider is installed and on) return
`step_lineage`: an input dataset per topic the batch read (`kafka://{bootstrap server}`, the topic; with
a topic_pattern, the matches its plan found), the output
sink and, under bad_record_policy="dead_letter", the dead-letter destination as output datasets,
named by the sinks (SinkCommitter.lineage_dataset), with record counts as the standard statistics facets;
and the run facet `exactlyOnceBatch`: the batch, its offset range per partition, its counts, its
state in the ledger, and the batches plan's recovery committed. Names and counts only: no setting of
a sink or a connection reaches a facet, so no secret can.
"""

from __future__ import annotations

from typing import Any

from airflow_exactly_once.airflow_integration.compat import openlineage
from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.lineage_names import DatasetName, kafka_dataset
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.topics import topics_of

FACET_NAME = "exactlyOnceBatch"
FACET_FIELDS = ("pipelineId", "batchId", "batchSeq", "state", "ranges", "inputRecords", "outputRecords", "badRecords",
                "recoveredBatches")


def batch_facet_fields(config: PipelineConfig, batch: Batch | None, recovered: list[str]) -> dict[str, Any]:
    """What the `exactlyOnceBatch` run facet says (before the batch is known: the pipeline only).

    `recovered`: the batches plan's recovery committed (left PREPARED by an earlier run)."""
    if batch is None:
        return {**dict.fromkeys(FACET_FIELDS), "pipelineId": config.pipeline_id, "ranges": [],
                "recoveredBatches": recovered}
    return {"pipelineId": batch.pipeline_id, "batchId": str(batch.id), "batchSeq": batch.seq,
            "state": batch.state.value,
            "ranges": [r.as_dict() for r in batch.ranges],
            "inputRecords": batch.input_records, "outputRecords": batch.output_records,
            "badRecords": batch.bad_records.count if batch.bad_records else None, "recoveredBatches": recovered}


def step_lineage(config: PipelineConfig, written: list[tuple[DatasetName, str]], batch: Batch | None,
                 recovered: list[str] | None = None) -> Any:
    """The OpenLineage provider's OperatorLineage of one step, or None without the [openlineage] extra.

    `written`: (where, role) of what the pipeline writes (sinks.dead_letters.lineage_outputs names them), so that
    this module knows OpenLineage and nothing of the sinks."""
    ol = openlineage()
    if ol is None:
        return None
    read = input_topics(config, batch)
    single_topic = len(read) == 1
    inputs = []
    for topic in read:
        name = kafka_dataset(config.bootstrap_servers, topic)
        facets = {}
        if batch is not None and batch.input_records is not None and single_topic:
            facets["inputStatistics"] = ol.InputStatistics(rowCount=batch.input_records)
        inputs.append(ol.InputDataset(name.namespace, name.name, inputFacets=facets))
    outputs = []
    for name, role in written:
        count = None if batch is None else (batch.output_records if role == "output" else
                                            (batch.bad_records.count if batch.bad_records else None))
        facets = {} if count is None else {"outputStatistics": ol.OutputStatistics(rowCount=count)}
        outputs.append(ol.OutputDataset(name.namespace, name.name, outputFacets=facets))
    facet = _facet_class(ol)(**batch_facet_fields(config, batch, list(recovered or ())))
    return ol.OperatorLineage(inputs=inputs, outputs=outputs, run_facets={FACET_NAME: facet})


def input_topics(config: PipelineConfig, batch: Batch | None) -> list[str]:
    """The topics of the batch's ranges (what a topic_pattern matched when it was planned); before the batch is
    known, the listed topics (none for a pattern)."""
    if batch is not None and batch.ranges:
        return topics_of((r.topic, r.partition) for r in batch.ranges)
    return list(config.topics)


_FACET_CLASSES: dict[type, type] = {}


def _facet_class(ol: Any) -> type:
    """The `exactlyOnceBatch` facet: a RunFacet of the installed OpenLineage client, made on first use (the
    client is an optional extra, so the class cannot be defined when this module is imported)."""
    if ol.RunFacet not in _FACET_CLASSES:
        fields = {name: ol.attr.field(default=None) for name in FACET_FIELDS}
        _FACET_CLASSES[ol.RunFacet] = ol.attr.make_class("ExactlyOnceBatchRunFacet", fields, bases=(ol.RunFacet,),
                                                         kw_only=True)
    return _FACET_CLASSES[ol.RunFacet]
