"""A pipeline's output sink paired with its dead-letter destination: a paired writer and a paired committer.

Under bad_record_policy="dead_letter" the pipeline's sink is this pair: the output sink gets the
good records, a second sink (a Kafka topic, a `_dead_letter` folder or table beside the
output) gets the bad ones as dead-letter records. The pair keeps the two-phase commit whole:

* the write stages both (or only the output, when the batch has no bad records);
* notify_complete first checks that both staged outputs are still there, then commits the
  dead letters and the output, each idempotently, so that a crash between them is finished
  by the retry or the next run's recovery; a batch whose staged output was lost (a timed-out
  transaction) is aborted before anything of it became visible;
* abort and retract take both away.

The pair's committable keeps the output's own handles at the top and the dead letters' under
"dead_letter": a ledger written before dead letters existed reads the same.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.declaration import SinkSpec
from airflow_exactly_once.core.faults import fault_point
from airflow_exactly_once.core.line_packages import LinePackage
from airflow_exactly_once.core.lineage_names import DatasetName
from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.sink import Committable, Handles, LedgerReader, RunWriters, SinkSide, StagedHistory
from airflow_exactly_once.core.sink_committer import SinkCommitter
from airflow_exactly_once.core.sink_writer import SinkWriter

DEAD_LETTER_HANDLES = "dead_letter"
Side = TypeVar("Side", SinkWriter, SinkCommitter)


@dataclass(frozen=True)
class PairedCommittable(Committable):
    """A batch's staged output and, if it had bad records, its staged dead letters.

    Made for the committable types of two sinks by `paired_committable`, which is what lets it read
    itself back from handles."""

    output_type: ClassVar[type[Committable]]
    dead_letter_type: ClassVar[type[Committable]]

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
        dead = handles.get(DEAD_LETTER_HANDLES)
        return cls(cls.output_type.from_handles(handles), cls.dead_letter_type.from_handles(dead) if dead else None)


@functools.cache
def paired_committable(output_type: type[Committable], dead_letter_type: type[Committable]) -> type[PairedCommittable]:
    """The paired committable of an output's and a dead-letter destination's committable types (one class each)."""
    return type(f"Paired{output_type.__name__}With{dead_letter_type.__name__}", (PairedCommittable,),
                {"output_type": output_type, "dead_letter_type": dead_letter_type, "__module__": __name__})


class Pair(SinkSide, Generic[Side]):
    """What the paired writer and the paired committer share: the output's side and the dead-letter
    destination's, and the output's spec (and so its type and guarantees) as the pair's."""

    def __init__(self, output: Side, dead: Side) -> None:
        self.output: Side = output
        self.dead: Side = dead
        super().__init__(output.spec)

    @property
    def spec_type(self) -> type[SinkSpec]:  # type: ignore[override]
        return self.output.spec_type


class PairedCommitter(Pair[SinkCommitter], SinkCommitter[PairedCommittable]):
    """The committers of the pipeline's output and of its dead-letter destination, as one."""

    @property
    def supports_retract(self) -> bool:  # type: ignore[override]
        return self.output.supports_retract and self.dead.supports_retract

    @property
    def committable_type(self) -> type[PairedCommittable]:  # type: ignore[override]
        # Named as Committable classes: mypy does not take a type[Any] (the sides' own) as hashable for the cache.
        output: type[Committable] = self.output.committable_type
        dead: type[Committable] = self.dead.committable_type
        return paired_committable(output, dead)

    def bind(self, config: PipelineConfig,
             history: StagedHistory[PairedCommittable] | None = None,
             ledger: LedgerReader | None = None) -> "PairedCommitter":
        """Each of the two committers sees its own part of every batch's committable."""
        super().bind(config, history, ledger)
        self.output.bind(config, None if history is None else lambda: [(b, c.output) for b, c in history()], ledger)
        self.dead.bind(config, None if history is None else
                       lambda: [(b, c.dead_letters) for b, c in history() if c.dead_letters is not None], ledger)
        return self

    def lineage_dataset(self) -> DatasetName | None:
        return self.output.lineage_dataset()

    def check(self, pipeline_id: str) -> None:
        self.output.check(pipeline_id)
        self.dead.check(pipeline_id)

    def commit_deadline_ms(self) -> int | None:
        deadlines = [d for d in (self.output.commit_deadline_ms(), self.dead.commit_deadline_ms()) if d is not None]
        return min(deadlines) if deadlines else None

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


class PairedWriter(Pair[SinkWriter], SinkWriter):
    """The writers of the pipeline's output and of its dead-letter destination, as one."""

    committer: PairedCommitter | None

    @property
    def splits_reads(self) -> bool:  # type: ignore[override]
        return self.output.splits_reads and self.dead.splits_reads

    @property
    def joins_reads(self) -> bool:  # type: ignore[override]
        return self.output.joins_reads and self.dead.joins_reads

    @property
    def changes_session_conf(self) -> bool:  # type: ignore[override]
        return self.output.changes_session_conf or self.dead.changes_session_conf

    def bind(self, config: PipelineConfig, committer: SinkCommitter) -> "PairedWriter":
        """Each writer with its own committer: the paired committer's output and dead-letter parts."""
        if not isinstance(committer, PairedCommitter):
            raise TypeError(f"a PairedWriter is bound to a PairedCommitter, not {type(committer).__name__}")
        super().bind(config, committer)
        self.output.bind(config, committer.output)
        self.dead.bind(config, committer.dead)
        return self

    def spark_packages(self) -> list[str | LinePackage]:
        return list(dict.fromkeys([*self.output.spark_packages(), *self.dead.spark_packages()]))

    def stage(self, frame: Any, batch: Batch, run_writers: RunWriters) -> PairedCommittable:
        return self._paired(self.output.stage(frame, batch, run_writers))

    def stage_batch(self, good: Any, bad: Any | None, batch: Batch, run_writers: RunWriters) -> PairedCommittable:
        output = self.output.stage(good, batch, run_writers)
        if bad is None:
            return self._paired(output)
        try:
            dead = self.dead.stage(self.dead.shape_dead_letters(bad), batch, run_writers)
        except Exception:
            self._committer().output.abort(batch, output)
            raise
        return self._paired(output, dead)

    def _paired(self, output: Committable, dead: Committable | None = None) -> PairedCommittable:
        return self._committer().committable_type(output, dead)

    def _committer(self) -> PairedCommitter:
        if self.committer is None:
            raise ValueError("bind the PairedWriter to the pipeline's PairedCommitter before staging")
        return self.committer


def lineage_outputs(committer: SinkCommitter) -> list[tuple[DatasetName, str]]:
    """(where, role) of what a bound committer writes: the sink ("output") and, when it is paired with a dead-letter
    destination, that destination ("dead_letter"); a side that names no dataset is left out."""
    parts = [(committer.output, "output"), (committer.dead, "dead_letter")] \
        if isinstance(committer, PairedCommitter) else [(committer, "output")]
    return [(name, role) for part, role in parts if (name := part.lineage_dataset()) is not None]
