"""Bad records: what a batch does with records that cannot be decoded or that the transform marks bad.

Invariant 8 (docs/protocol.md): an undecodable record follows the chosen policy and is
counted, never turned into a row of nulls that commits as if it were data.

* `fail` (default): the batch fails without retries; the error names the first bad records
  (topic, partition, offset, error, a prefix of the value). Nothing becomes visible.
* `dead_letter`: bad records go to a dead-letter destination staged and committed with the
  batch's output (good and bad become visible together; an aborted batch shows neither).
* `skip`: bad records are counted and recorded in the ledger, and not written.

`max_bad_records` fails the batch, whatever the policy, when it holds more bad records
than a count or a fraction of its input. Pure: the Spark job counts, this decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.errors import BadRecordsError
from airflow_exactly_once.core.model import BAD_RECORDS, BadRecordsNote

# The columns of a dead-letter record, whatever the destination (Kafka puts all but key and
# value in headers, as Kafka Connect's dead-letter queue does).
DEAD_LETTER_COLUMNS = ("pipeline_id", "batch_id", "source_topic", "source_partition", "source_offset",
                       "source_timestamp", "key", "value", "error")
# PostgreSQL types of those columns, for the dead-letter table the sink creates if it is missing.
DEAD_LETTER_PG_TYPES = {"pipeline_id": "text", "batch_id": "text", "source_topic": "text",
                        "source_partition": "integer", "source_offset": "bigint", "source_timestamp": "timestamptz",
                        "key": "bytea", "value": "bytea", "error": "text"}
# A prefix no pipeline id can contain ('~' is not allowed in one): the dead-letter writer's
# transactions never meet the output's.
DEAD_LETTER_SUFFIX = "~dead-letter"
VALUE_PREFIX = 80  # characters of a bad value shown in an error or an event


@dataclass
class BadRecordCounts:
    """What the Spark job counted in one batch, and the first bad records it looked at."""

    input_records: int
    undecodable: int = 0
    marked_by_transform: int = 0
    first: list[dict[str, Any]] = field(default_factory=list)  # topic, partition, offset, error, value

    @property
    def bad(self) -> int:
        return self.undecodable + self.marked_by_transform

    def describe_first(self) -> str:
        return "; ".join(f"{r['topic']}[{r['partition']}] offset {r['offset']}: {r['error']} (value "
                         f"{_prefix(r.get('value'))})" for r in self.first)

    def note(self, policy: str) -> BadRecordsNote:
        """What the ledger keeps with the batch (the first records without their values)."""
        return BadRecordsNote(self.bad, policy, self.undecodable, self.marked_by_transform,
                              tuple({k: r[k] for k in ("topic", "partition", "offset", "error")} for r in self.first))

    def details(self, policy: str) -> dict[str, Any]:
        """The batch's details that say it: {BAD_RECORDS: the note}."""
        return {BAD_RECORDS: self.note(policy).as_details()}


def _prefix(value: Any) -> str:
    if value is None:
        return "null"
    text = value.decode("utf-8", errors="replace") if isinstance(value, (bytes, bytearray)) else str(value)
    return repr(text[:VALUE_PREFIX] + ("..." if len(text) > VALUE_PREFIX else ""))


def check_counts(config: PipelineConfig, counts: BadRecordCounts, batch_label: str) -> None:
    """Raise BadRecordsError when the batch must fail: any bad record under `fail`, or too many under any policy."""
    if not counts.bad:
        return
    what = (f"{counts.bad} of {counts.input_records} records of batch {batch_label} are bad "
            f"({counts.undecodable} could not be decoded as {config.value_format or 'the transform expects'}, "
            f"{counts.marked_by_transform} marked bad by the transform); the first: {counts.describe_first()}")
    limit = config.max_bad_records
    if limit is not None:
        allowed = limit * counts.input_records if isinstance(limit, float) else limit
        if counts.bad > allowed:
            raise BadRecordsError(f"{what}. That is more than max_bad_records={limit!r}, so the batch fails whatever "
                                  "the bad_record_policy; nothing was written. Fix the producer or the schema, or "
                                  "raise max_bad_records.")
    if config.bad_record_policy == "fail":
        raise BadRecordsError(f"{what}. bad_record_policy='fail': nothing was written and the offsets did not move. "
                              "Fix the producer or value_schema, or choose bad_record_policy='dead_letter' (they go "
                              "to a dead-letter destination with the batch) or 'skip' (counted and recorded).")
