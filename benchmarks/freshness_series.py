"""The freshness benchmark's time series and the checks made on them (issue 51: the hour run and the faults).

Pure computation on what benchmarks/bench_freshness.py recorded, so that the windowing, the drift checks and the
recovery time are unit-tested without a broker (tests/unit/test_freshness_series.py). Times are seconds from the
moment the measured producer started; latencies are seconds from produced to visible.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from typing import Sequence

GOAL_P99_SECONDS = 10.0  # issue 51's goal at 1,000 records/s, the line the recovery time is measured against
WINDOW_SECONDS = 10.0  # one point of the series
RECOVERY_WINDOW_SECONDS = 20.0  # the rolling p99 a recovery is judged on
RECOVERY_HOLD_SECONDS = 30.0  # ... and how long it must stay under the goal
RECOVERY_STEP_SECONDS = 1.0
# Plan and notify_complete are flat unless the last window's median is both this much larger and this much slower
# than the first's: the ratio alone would fail 0.3 s -> 0.5 s, which is noise on a shared machine.
TASK_GROWTH_RATIO = 1.5
TASK_GROWTH_SECONDS = 0.2
MEMORY_CHANGE_LIMIT = 0.10  # a long-lived process's resident memory moves less than this between the windows
# A process's memory at rest: the 10th percentile of its samples in a window. The scheduler's samples include the
# task processes its LocalExecutor runs (and the dag-processor's its parsing processes) when one runs at the
# sample: the median of such a series says how often a task ran, its floor what the process keeps. A leak lifts the
# floor too.
MEMORY_FLOOR_SHARE = 0.10


def nearest_rank(share: float, count: int) -> int:
    """The 1-based rank of the nearest-rank percentile `share` among `count` values (bench_freshness.percentile)."""
    return min(count, max(1, int(round(share * count))))


@dataclass(frozen=True)
class Visibility:
    """When each record became visible and its produced-to-visible latency, in visibility order."""

    visible_s: list[float]
    latency_s: list[float]

    @classmethod
    def of(cls, pairs: Sequence[tuple[float, float]]) -> "Visibility":
        ordered = sorted(pairs)
        return cls([p[0] for p in ordered], [p[1] for p in ordered])

    def between(self, start: float, end: float) -> list[float]:
        """Latencies of the records visible in [start, end)."""
        return self.latency_s[bisect.bisect_left(self.visible_s, start):bisect.bisect_left(self.visible_s, end)]


def latency_windows(visibility: Visibility, end: float, width: float = WINDOW_SECONDS) -> list[dict[str, float]]:
    """One point per `width` seconds from 0 to `end`: the records that became visible in that window, their p50 and
    p99 (nearest rank); a window without any has count 0 and no percentiles (a stalled pipeline shows as a gap)."""
    points: list[dict[str, float]] = []
    start = 0.0
    while start < end:
        ordered = sorted(visibility.between(start, start + width))
        point: dict[str, float] = {"t": start, "count": len(ordered)}
        if ordered:
            point["p50"] = ordered[nearest_rank(0.50, len(ordered)) - 1]
            point["p99"] = ordered[nearest_rank(0.99, len(ordered)) - 1]
        points.append(point)
        start += width
    return points


@dataclass(frozen=True)
class Comparison:
    """A quantity in an early window against a late one (a median, or a memory's floor), and whether that is flat."""

    what: str
    first: float
    last: float
    flat: bool
    rule: str

    @property
    def ratio(self) -> float:
        return self.last / self.first if self.first else float("inf")

    def describe(self) -> str:
        return (f"{self.what}: {self.first:.3f} -> {self.last:.3f} ({self.ratio:.2f}x, {self.last - self.first:+.3f}); "
                f"{'flat' if self.flat else 'NOT FLAT'} ({self.rule})")


def median_between(points: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """The median of the values whose time is in [start, end); None when there is none."""
    values = [value for at, value in points if start <= at < end]
    return statistics.median(values) if values else None


def percentile_between(points: Sequence[tuple[float, float]], start: float, end: float, share: float) -> float | None:
    """The nearest-rank percentile `share` of the values whose time is in [start, end); None when there is none."""
    values = sorted(value for at, value in points if start <= at < end)
    return values[nearest_rank(share, len(values)) - 1] if values else None


def task_windows(total: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """The first and the last sixth of the run (10 minutes each of the hour) for the plan / notify_complete check."""
    sixth = min(total / 6, 600.0)
    return (0.0, sixth), (total - sixth, total)


def memory_windows(total: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """Minutes 5-10 of the hour and its last 5 (a twelfth of other runs' length): the first minutes warm up."""
    twelfth = min(total / 12, 300.0)
    return (twelfth, 2 * twelfth), (total - twelfth, total)


def task_flatness(task: str, durations: Sequence[tuple[float, float]], total: float) -> Comparison | None:
    """A task's duration (run start, seconds) in the first window against the last: not flat when the last median
    is more than TASK_GROWTH_RATIO times the first and more than TASK_GROWTH_SECONDS slower. None: a window has no
    run."""
    (a, b), (c, d) = task_windows(total)
    first, last = median_between(durations, a, b), median_between(durations, c, d)
    if first is None or last is None:
        return None
    grew = last > first * TASK_GROWTH_RATIO and last - first > TASK_GROWTH_SECONDS
    return Comparison(f"{task} s (median, first vs last {b:.0f} s)", first, last, not grew,
                      f"fails over {TASK_GROWTH_RATIO}x and +{TASK_GROWTH_SECONDS} s")


def memory_flatness(process: str, samples: Sequence[tuple[float, float]], total: float) -> Comparison | None:
    """A process's resident MB at rest (MEMORY_FLOOR_SHARE) in the baseline window against the last: flat within
    MEMORY_CHANGE_LIMIT either way. None: a window has no sample."""
    (a, b), (c, d) = memory_windows(total)
    first = percentile_between(samples, a, b, MEMORY_FLOOR_SHARE)
    last = percentile_between(samples, c, d, MEMORY_FLOOR_SHARE)
    if first is None or last is None:
        return None
    change = abs(last - first) / first if first else float("inf")
    what = f"{process} MB (at rest: percentile {MEMORY_FLOOR_SHARE:.0%}, {a:.0f}-{b:.0f} s vs the last {d - c:.0f} s)"
    return Comparison(what, first, last, change <= MEMORY_CHANGE_LIMIT,
                      f"fails beyond {MEMORY_CHANGE_LIMIT:.0%} change")


def ledger_bound(retention_batches: int, prune_slack: int, in_flight: int = 2) -> int:
    """The most batches the ledger may hold with retention on: the kept ones, those notify_complete lets pile up
    before it prunes (core/retention.py's AUTO_PRUNE_MIN), the committed floor and the batches in flight."""
    return retention_batches + prune_slack + 1 + in_flight


def under_goal(visibility: Visibility, at: float, goal: float = GOAL_P99_SECONDS,
               window: float = RECOVERY_WINDOW_SECONDS) -> bool:
    """Whether the rolling p99 at `at` (the records visible in (at - window, at]) is at most `goal`. A window with no
    record visible is not fresh: a stalled pipeline shows nothing."""
    lo = bisect.bisect_right(visibility.visible_s, at - window)
    hi = bisect.bisect_right(visibility.visible_s, at)
    latencies = visibility.latency_s[lo:hi]
    if not latencies:
        return False
    # the nearest-rank p99 is at most the goal when at least that rank of the values are
    return sum(1 for value in latencies if value <= goal) >= nearest_rank(0.99, len(latencies))


def recovery_seconds(visibility: Visibility, returned: float, until: float, goal: float = GOAL_P99_SECONDS,
                     window: float = RECOVERY_WINDOW_SECONDS, hold: float = RECOVERY_HOLD_SECONDS,
                     step: float = RECOVERY_STEP_SECONDS) -> float | None:
    """Seconds from a component's return until the rolling p99 is under `goal` and stays so for `hold` seconds
    (checked every `step`); None when that is not seen before `until` (the last record visible)."""
    at = returned
    held_since: float | None = None
    while at <= until:
        if under_goal(visibility, at, goal, window):
            held_since = at if held_since is None else held_since
            if at - held_since >= hold:
                return held_since - returned
        else:
            held_since = None
        at += step
    return None
