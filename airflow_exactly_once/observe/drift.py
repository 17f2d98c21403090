"""Drift: where the other accounts of a pipeline's committed offsets differ from the ledger.

The ledger is the only truth (docs/protocol.md). Two others keep an account of it, and people read
them as if they were: the mirrored consumer group (kafka/consumer_group.py, what lag dashboards read)
and the Asset events Airflow recorded for committed batches (airflow_integration/assets.py, what downstream DAGs
run on).
This compares them with the ledger and says, for each difference, what caused it and how to repair it.
A difference that a recorded decision explains (a rewind, a re-run that re-announced a batch) is a
note, not drift. Reading Kafka and Airflow is the caller's; this module only compares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable

from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.core.model import Batch, BatchId
from airflow_exactly_once.core.states import BatchState
from airflow_exactly_once.core.topics import topics_of

TopicPartition = tuple[str, int]
MIRROR_METADATA_PREFIX = "airflow-exactly-once:"  # what the mirror writes as each offset's metadata


def mirror_metadata(pipeline_id: str) -> str:
    """The metadata the mirror writes with each group offset: who committed it."""
    return f"{MIRROR_METADATA_PREFIX}{pipeline_id}"


def mirror_command(pipeline_id: str, options: str = "") -> str:
    """The command that copies the ledger's positions to the group again (the repair the check names)."""
    return f"airflow-exactly-once mirror {pipeline_id}{options} --execute"


@dataclass(frozen=True)
class GroupOffset:
    """One committed offset of the mirrored consumer group, as Kafka returns it."""

    offset: int
    metadata: str = ""


@dataclass(frozen=True)
class RecordedEvent:
    """One Asset event Airflow recorded for the pipeline, reduced to what the ledger can confirm."""

    batch_seq: int | None
    ranges: tuple[tuple[str, int, int, int], ...]  # (topic, partition, start, end)
    source: str = ""  # "dag_id/run_id/task_id", or how it was made
    at: str = ""

    @classmethod
    def from_extra(cls, extra: dict[str, Any] | None, source: str = "", at: str = "") -> RecordedEvent:
        """From an event's extra as assets.batch_event_extra wrote it (anything else has no batch_seq)."""
        extra = extra or {}
        seq = extra.get("batch_seq")
        ranges = tuple(sorted((str(r.get("topic")), int(r.get("partition", -1)), int(r.get("start", -1)),
                               int(r.get("end", -1))) for r in extra.get("ranges") or () if isinstance(r, dict)))
        return cls(seq if isinstance(seq, int) else None, ranges, source, at)


@dataclass(frozen=True)
class Finding:
    """One difference: `drift` ones make the check fail; the others are explained by the ledger."""

    kind: str
    subject: str
    detail: str
    cause: str
    repair: str = ""
    drift: bool = True

    def describe(self) -> str:
        label = "DRIFT" if self.drift else "note"
        text = f"{label} {self.kind} {self.subject}: {self.detail}. Cause: {self.cause}"
        return text + (f". Repair: {self.repair}" if self.repair else "")


@dataclass
class DriftReport:
    pipeline_id: str
    compared: list[str] = field(default_factory=list)  # what was compared, for the reader
    findings: list[Finding] = field(default_factory=list)

    @property
    def drift(self) -> list[Finding]:
        return [f for f in self.findings if f.drift]

    @property
    def ok(self) -> bool:
        return not self.drift


GroupReader = Callable[[str], "dict[TopicPartition, GroupOffset] | None"]
# Reads the Asset events recorded at or after the given time (None: all of them).
EventReader = Callable[["datetime | None"], "list[RecordedEvent] | None"]
# How much earlier than the newest pruned batch's planning the events are read: the ledger's clock (the task that
# planned) and Airflow's (the one that recorded the event) may disagree by this much.
EVENT_CLOCK_SKEW = timedelta(hours=1)


def check_drift(ledger: Ledger, pipeline_id: str, *, read_group: GroupReader | None, read_events: EventReader | None,
                asset_uri: str, mirror_command: str, newest_batches: int | None = None) -> DriftReport:
    """Both comparisons of one pipeline. A reader that is None is left out; one that returns None could not read
    (its caller says why: the CLI raises instead, the ledger page shows the error). `newest_batches`: compare the
    events of the newest committed batches only (the ledger page: the batches it shows); None: every kept one."""
    report = DriftReport(pipeline_id)
    stored = ledger.stored_config(pipeline_id)
    group = stored.get("mirror_consumer_group")
    if read_group is None:
        report.compared.append("consumer group: left out")
    elif not group:
        report.compared.append("consumer group: none (mirror_consumer_group is not set)")
    else:
        offsets = read_group(group)
        report.compared.append(f"consumer group {group!r}" + ("" if offsets is not None else ": could not be read"))
        if offsets is not None:
            # A topic_pattern's topics are those the batches read (the ledger's positions, see compare_group).
            report.findings += compare_group(ledger, pipeline_id, group, stored.get("topics") or [], offsets,
                                             mirror_command)
    if read_events is None:
        report.compared.append("Asset events: left out")
    else:
        compared = compared_batches(ledger, pipeline_id, newest_batches)
        events = read_events(compared.since)
        window = f" for the newest {len(compared.committed)} committed batches" if compared.cut else ""
        report.compared.append(f"Asset events of {asset_uri}: could not be read" if events is None
                               else f"{len(events)} Asset event(s) of {asset_uri}{window}")
        if events is not None:
            report.findings += compare_asset_events(ledger, pipeline_id, events, asset_uri, compared)
    return report


@dataclass
class ComparedBatches:
    """The committed batches the event comparison covers (by seq): every one above `above`. `since`: when the
    events worth reading start (None: all); `cut`: a window of the newest batches, older ones kept but not
    compared."""

    above: int
    committed: dict[int, Batch]
    since: datetime | None
    cut: bool = False


def compared_batches(ledger: Ledger, pipeline_id: str, newest: int | None = None) -> ComparedBatches:
    """The committed batches above retention's floor (the newest `newest` of them when given).

    Events of batches below are not compared, and each event was recorded after its batch was planned: so only
    events from a little before the first compared batch (or the newest pruned one) was planned are read. That
    keeps the check, which the ledger page runs on every view, as bounded as the ledger or the window; an event
    posted by hand before then is not seen. With a window and nothing pruned, the events are read from the
    pipeline's registration (or its first compared batch, if older) on: never all that Airflow holds, which may be
    a year of events beside a new or reset ledger (`airflow-exactly-once check` compares those).
    """
    floor = ledger.retention_floor(pipeline_id)
    if newest is None:
        found = ledger.list_batches(pipeline_id, [BatchState.COMMITTED], newest_first=False)
    else:
        found = list(reversed(ledger.list_batches(pipeline_id, [BatchState.COMMITTED], limit=newest)))
    committed = {b.seq: b for b in found if b.seq > floor.batch_seq}
    if newest is not None and len(committed) == newest:
        first = committed[min(committed)]
        return ComparedBatches(first.seq - 1, committed, _before(first.created_at), cut=True)
    since = _utc(floor.batch_created_at)
    if newest is not None and since is None:
        registered = ledger.pipeline(pipeline_id)
        starts = [registered["created_at"] if registered else None] + [b.created_at for b in found[:1]]
        known = [t for t in map(_utc, starts) if t is not None]
        since = min(known) if known else None
    return ComparedBatches(floor.batch_seq, committed, _before(since))


def _utc(at: datetime | None) -> datetime | None:
    return at if at is None or at.tzinfo else at.replace(tzinfo=timezone.utc)  # SQLite returns naive times


def _before(planned: datetime | None) -> datetime | None:
    at = _utc(planned)
    return None if at is None else at - EVENT_CLOCK_SKEW


def _tp(tp: TopicPartition) -> str:
    return f"{tp[0]}[{tp[1]}]"


def _last_events(ledger: Ledger, pipeline_id: str, *kinds: str) -> list[dict[str, Any] | None]:
    """The newest event of each kind (None where there is none)."""
    found: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        newest = ledger.list_events(pipeline_id, limit=1, kinds=[kind])
        if newest:
            found[kind] = newest[0]
    return [found.get(kind) for kind in kinds]


def compare_group(ledger: Ledger, pipeline_id: str, group: str, topics: Iterable[str],
                  offsets: dict[TopicPartition, GroupOffset], mirror_command: str) -> list[Finding]:
    """The mirrored group's offsets against the ledger's committed positions.

    `offsets`: every offset the group holds; those of topics the pipeline neither lists nor has read are none of
    this pipeline's.
    `mirror_command`: the command that copies the ledger's positions to the group again.
    """
    positions = ledger.committed_positions(pipeline_id)
    ours = mirror_metadata(pipeline_id)
    failed, rewound = _last_events(ledger, pipeline_id, "mirror-failed", "rewind")
    repair = f"run `{mirror_command}`"
    findings = []
    for tp, position in sorted(positions.items()):
        held = offsets.get(tp)
        if held is not None and held.offset == position:
            continue
        if held is None:
            cause = (f"the last mirror failed ({failed['message']})" if failed else
                     "no notify_complete has mirrored since the pipeline started reading this partition")
            findings.append(Finding("group-missing", _tp(tp), f"group {group!r} holds no offset, the ledger's "
                                    f"position is {position}", cause, repair))
            continue
        other = held.metadata != ours
        if held.offset < position:
            cause = (f"the last mirror failed ({failed['message']})" if failed else
                     "a batch was committed and its notify_complete did not reach the mirror (it ends the task)")
            kind = "group-behind"
        else:
            cause = ("a rewind moved the ledger back and no batch has committed since"
                     if rewound and not other else "the offset was committed by someone else")
            kind = "group-ahead"
        if other:
            cause = (f"a consumer other than this pipeline commits to the group (its metadata: "
                     f"{held.metadata!r}, the mirror writes {ours!r}): " + cause)
            repair = (f"stop that consumer (or give it its own group.id: the group is this pipeline's mirror), "
                      f"then run `{mirror_command}`")
        findings.append(Finding(kind, _tp(tp), f"group {group!r} is at {held.offset}, the ledger's position is "
                                f"{position} ({abs(position - held.offset)} offsets "
                                f"{'behind' if held.offset < position else 'ahead'})", cause, repair))
    watched = set(topics) | set(topics_of(positions))  # the listed topics, and those a pattern's batches read
    for tp, held in sorted(offsets.items()):
        if tp[0] in watched and tp not in positions:
            findings.append(Finding("group-unknown-partition", _tp(tp), f"group {group!r} holds offset {held.offset} "
                                    "for a partition the pipeline has never read",
                                    "another consumer committed it (metadata " + repr(held.metadata) + ")",
                                    f"kafka-consumer-groups.sh --delete-offsets --group {group} --topic "
                                    f"{tp[0]}:{tp[1]}"))
    return findings


def compare_asset_events(ledger: Ledger, pipeline_id: str, events: list[RecordedEvent],
                         asset_uri: str, compared: ComparedBatches | None = None) -> list[Finding]:
    """Airflow's Asset events of the pipeline against its committed batches: one per batch, the same ranges.

    Batches retention pruned (or below the `compared` window) are not compared; events before the first one
    Airflow still holds may have been cleaned by `airflow db clean`.
    """
    compared = compared or compared_batches(ledger, pipeline_id)
    floor, committed = compared.above, compared.committed
    by_seq: dict[int, list[RecordedEvent]] = {}
    findings: list[Finding] = []
    for event in events:
        if event.batch_seq is None:
            findings.append(Finding("event-without-batch", asset_uri, f"an event from {event.source or 'unknown'} "
                                    f"at {event.at} names no batch_seq", "it was not made by this provider's "
                                    "notify_complete or plan (e.g. posted through Airflow's API by hand)",
                                    "downstream DAGs cannot tell which offsets it stands for; use the batch events"))
            continue
        if event.batch_seq > floor:
            by_seq.setdefault(event.batch_seq, []).append(event)
    uncommitted = [seq for seq in by_seq if seq not in committed]
    newest = next(iter(ledger.list_batches(pipeline_id, limit=1)), None) if uncommitted else None
    for seq, recorded in sorted(by_seq.items()):
        findings += _compare_batch_events(ledger, pipeline_id, seq, committed.get(seq), recorded, newest)
    missing = sorted(set(committed) - set(by_seq))
    if missing:
        findings += _missing_events(committed, missing, by_seq, asset_uri)
    return findings


def _ranges(batch: Batch) -> tuple[tuple[str, int, int, int], ...]:
    return tuple(sorted((r.topic, r.partition, r.start, r.end) for r in batch.ranges))


def _compare_batch_events(ledger: Ledger, pipeline_id: str, seq: int, batch: Batch | None,
                          recorded: list[RecordedEvent], newest: Batch | None) -> list[Finding]:
    """`newest`: the ledger's newest batch; events of batches above it (another ledger's) need no lookup each."""
    subject = f"batch {seq}"
    sources = ", ".join(sorted({e.source for e in recorded if e.source})) or "unknown"
    if batch is None:
        found = ledger.find_batch(BatchId(pipeline_id, seq)) if newest is not None and seq <= newest.seq else None
        state = None if found is None else found.state
        if state is BatchState.RETRACTED:
            return [Finding("event-for-retracted-batch", subject, f"Airflow announced it ({sources}); the ledger "
                            "holds it RETRACTED", "its output was withdrawn on purpose (a rewind or a re-run of "
                            "its interval, see `events`); downstream DAGs that ran on it saw output that is gone",
                            "re-run the downstream runs of that event if they copied the output", drift=False)]
        what = f"the ledger holds it {state.value}" if state else (
            "the ledger has no such batch" + (f" (its newest is {newest.seq})" if newest else " (it holds none)"))
        return [Finding("event-for-uncommitted-batch", subject, f"Airflow recorded it as committed ({sources}); "
                        f"{what}", "the DAG wrote to another ledger than the one checked (compare ledger_conn_id / "
                        "--ledger-url), the ledger was reset or restored from a backup, or the event was posted by "
                        "hand", "check the ledger; if it was reset, downstream DAGs ran on output the ledger does "
                        "not account for")]
    findings = []
    wrong = [e for e in recorded if e.ranges != _ranges(batch)]
    if wrong:
        findings.append(Finding("event-ranges-differ", subject, f"{len(wrong)} event(s) ({sources}) announce "
                                f"{_show(wrong[0].ranges)}, the ledger committed {_show(_ranges(batch))}",
                                "the ledger was reset or restored and its batch numbers were used again, or the "
                                "event was posted by hand", "check the ledger the DAG uses; downstream DAGs ran on "
                                "the event's ranges"))
    if len(recorded) - len(wrong) > 1:
        findings.append(Finding("event-repeated", subject, f"Airflow recorded {len(recorded)} events for it "
                                f"({sources})", "its notify_complete ran again (a cleared task or run): the batch "
                                "was committed once and each run announces it again; DAGs scheduled on the Asset "
                                "ran once per event", "downstream tasks should key on the event's batch_seq",
                                drift=False))
    return findings


def _missing_events(committed: dict[int, Batch], missing: list[int], by_seq: dict[int, list[RecordedEvent]],
                    asset_uri: str) -> list[Finding]:
    first_announced = min(by_seq) if by_seq else None
    older = [s for s in missing if first_announced is not None and s < first_announced]
    newer = [s for s in missing if first_announced is None or s > first_announced]
    findings = []
    if older:
        findings.append(Finding("events-before-history", f"batches {_seqs(older)}", f"Airflow holds no event for "
                                f"them; its oldest event of {asset_uri} is for batch {first_announced}",
                                "Airflow's event history starts later (`airflow db clean`), or the DAG's "
                                "notify_complete had no outlets then", drift=False))
    if newer:
        runs = ", ".join(sorted({committed[s].run_id for s in newer})[:5])
        cause = ("the pipeline's notify_complete has no outlets (the task group gives it the AssetAlias "
                 "exactly-once-batches), or its events were cleaned" if first_announced is None else
                 "its notify_complete was marked success without running, or failed after committing and was "
                 "not run again")
        findings.append(Finding("event-missing", f"batches {_seqs(newer)}", f"committed in the ledger, no Asset "
                                f"event of {asset_uri} (runs {runs})", cause, "clear notify_complete of those runs: "
                                "it finds the batch committed, changes nothing and announces it"))
    return findings


def _show(ranges: tuple[tuple[str, int, int, int], ...]) -> str:
    return ", ".join(f"{t}[{p}] {s}..{e}" for t, p, s, e in ranges) or "no ranges"


def _seqs(seqs: list[int]) -> str:
    return ", ".join(map(str, seqs[:10])) + (f" and {len(seqs) - 10} more" if len(seqs) > 10 else "")
