"""The output and its dead letters as one sink: staged by the same write, committed by the same notify_complete.

With bad_record_policy="dead_letter" the pipeline's sink is this pair: the output sink gets the
good records, a second sink (a Kafka topic, a `_dead_letter` folder or table beside the
output) gets the bad ones as dead-letter records. The pair keeps the two-phase commit whole:

* the write stages both (or only the output, when the batch has no bad records);
* notify_complete first checks that both staged outputs are still there, then commits the
  dead letters and the output, each idempotently, so that a crash between them is finished
  by the retry or the next run's recovery; a batch whose staged output was lost (a timed-out
  transaction) is aborted before anything of it became visible;
* abort and retract take both away.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.faults import fault_point
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import Committable, Handles, RunWriters, Sink, StagedHistory

DEAD_LETTER_HANDLES = "dead_letter"


@dataclass(frozen=True)
class PairedCommittable(Committable):
    """A batch's staged output and, if it had bad records, its staged dead letters."""

    output: Committable
    dead_letters: Committable | None = None

    @property
    def records(self) -> int | None:
        return self.output.records

    def to_handles(self) -> Handles:
        # The output's own handles at the top: a ledger written before dead letters existed reads the same. No
        # format version of the pair's: each part's handles carry their own committable's (core.handles).
        return {**self.output.to_handles(),
                DEAD_LETTER_HANDLES: None if self.dead_letters is None else self.dead_letters.to_handles()}

    @classmethod
    def from_handles(cls, handles: Handles) -> "PairedCommittable":
        raise TypeError("a PairedCommittable is read by its SinkWithDeadLetters, which knows both sinks")


class SinkWithDeadLetters(Sink):
    """The pipeline's output sink and its dead-letter sink, as one."""

    def __init__(self, output: Sink, dead: Sink) -> None:
        self.spec_type = output.spec_type  # the output's spec (and type), checked by it
        super().__init__(output.spec)
        self.output = output
        self.dead = dead
        self.guarantees = output.guarantees
        self.supports_retract = output.supports_retract and dead.supports_retract
        self.splits_reads = output.splits_reads and dead.splits_reads
        self.joins_reads = output.joins_reads and dead.joins_reads

    @property
    def guarantee(self) -> str:
        return self.output.guarantee

    def bind(self, config: PipelineConfig, history: StagedHistory | None = None) -> "SinkWithDeadLetters":
        """Each of the two sinks sees its own part of every batch's committable."""
        self.output.bind(config, None if history is None else lambda: [(b, c.output) for b, c in history()])
        self.dead.bind(config, None if history is None else
                       lambda: [(b, c.dead_letters) for b, c in history() if c.dead_letters is not None])
        self.pipeline = config
        self.history = history
        return self

    def check(self, pipeline_id: str) -> None:
        self.output.check(pipeline_id)
        self.dead.check(pipeline_id)

    def spark_packages(self) -> list[str]:
        return list(dict.fromkeys([*self.output.spark_packages(), *self.dead.spark_packages()]))

    def commit_deadline_ms(self) -> int | None:
        deadlines = [d for d in (self.output.commit_deadline_ms(), self.dead.commit_deadline_ms()) if d is not None]
        return min(deadlines) if deadlines else None

    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> PairedCommittable:
        return PairedCommittable(self.output.stage(frame, batch, run_writers))

    def stage_batch(self, good: Any, bad: Any | None, batch: Batch, run_writers: RunWriters) -> PairedCommittable:
        output = self.output.stage(good, batch, run_writers)
        if bad is None:
            return PairedCommittable(output)
        try:
            dead = self.dead.stage(self.dead.shape_dead_letters(bad), batch, run_writers)
        except Exception:
            self.output.abort(batch, output)
            raise
        return PairedCommittable(output, dead)

    def committable(self, handles: Handles | None) -> PairedCommittable | None:
        if not handles:
            return None
        return PairedCommittable(self.output.committable(handles),
                                 self.dead.committable(handles.get(DEAD_LETTER_HANDLES)))

    def verify_staged(self, batch: Batch, committable: PairedCommittable) -> None:
        self.output.verify_staged(batch, committable.output)
        if committable.dead_letters is not None:
            self.dead.verify_staged(batch, committable.dead_letters)

    def commit(self, batch: Batch, committable: PairedCommittable) -> str:
        self.verify_staged(batch, committable)
        dead = self._commit_dead_letters(batch, committable)
        return "; ".join([self.output.commit(batch, committable.output), *dead])

    def abort(self, batch: Batch, committable: PairedCommittable | None) -> str:
        output = self.output.abort(batch, None if committable is None else committable.output)
        dead = self.dead.abort(batch, None if committable is None else committable.dead_letters)
        return f"{output}; dead letters: {dead}"

    def retract(self, batch: Batch, committable: PairedCommittable | None) -> str:
        output = self.output.retract(batch, None if committable is None else committable.output)
        dead = self.dead.retract(batch, None if committable is None else committable.dead_letters)
        return f"{output}; dead letters: {dead}"

    def commit_replacing(self, batch: Batch, committable: PairedCommittable, replaced: Batch) -> str:
        self.verify_staged(batch, committable)
        old = self.committable(replaced.handles)
        dead = self._commit_dead_letters(batch, committable)
        parts = [self.output.commit_replacing(batch, committable.output, replaced), *dead]
        parts.append(f"old dead letters: {self.dead.retract(replaced, None if old is None else old.dead_letters)}")
        return "; ".join(parts)

    def _commit_dead_letters(self, batch: Batch, committable: PairedCommittable) -> list[str]:
        """First of the two commits: a crash after it leaves the output to the retry or the next recovery."""
        if committable.dead_letters is None:
            return []
        outcome = self.dead.commit(batch, committable.dead_letters)
        fault_point("notify.after_dead_letter_commit")
        return [f"dead letters: {outcome}"]
