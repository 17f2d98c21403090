"""The freshness benchmark's series and checks (benchmarks/freshness_series.py, issue 51's hour run and faults):
windowing, the flatness rules, the ledger bound and the recovery time, on made-up records."""

from __future__ import annotations

import sys
import time

import pytest

from benchmarks.bench_freshness import OursResult, drift_checks, failed_tasks, fault_checks, percentile
from benchmarks.freshness_faults import Fault, FaultInjector, fault_offsets
from benchmarks.freshness_plots import PlotLibraryMissing, pyplot
from benchmarks.freshness_sampler import heap_used_kb
from benchmarks.freshness_series import (Visibility, latency_windows, ledger_bound, memory_flatness, memory_windows,
                                         recovery_seconds, task_flatness, task_windows, under_goal)


def steady(start: float, end: float, latency: float, per_second: int = 10) -> list[tuple[float, float]]:
    """A record visible every 1/per_second s in [start, end), each with `latency`."""
    return [(k / per_second, latency) for k in range(int(start * per_second), int(end * per_second))]


# -- windows -------------------------------------------------------------------------------------------------------


def test_each_record_counts_in_the_window_it_became_visible_in():
    visibility = Visibility.of([(9.99, 1.0), (10.0, 5.0), (0.0, 2.0), (19.5, 7.0), (35.0, 9.0)])
    windows = latency_windows(visibility, end=40)
    assert [w["t"] for w in windows] == [0, 10, 20, 30]
    assert [w["count"] for w in windows] == [2, 2, 0, 1]
    assert (windows[0]["p50"], windows[0]["p99"]) == (1.0, 2.0)
    assert (windows[1]["p50"], windows[1]["p99"]) == (5.0, 7.0)
    assert "p99" not in windows[2]  # nothing visible: a gap, not a zero latency
    assert windows[3]["p99"] == 9.0


def test_a_windows_percentiles_are_nearest_rank():
    latencies = [float(v) for v in range(1, 201)]  # 1..200 s, all visible in the first window
    [window] = latency_windows(Visibility.of([(i / 100, v) for i, v in enumerate(latencies)]), end=10)
    assert (window["p50"], window["p99"]) == (percentile(latencies, 0.50), percentile(latencies, 0.99)) == (100, 198)


# -- flatness ------------------------------------------------------------------------------------------------------


def test_the_hour_compares_its_first_and_last_ten_minutes_and_memory_minutes_5_to_10_with_the_last_5():
    assert task_windows(3600) == ((0, 600), (3000, 3600))
    assert memory_windows(3600) == ((300, 600), (3300, 3600))
    assert task_windows(240) == ((0, 40), (200, 240))  # a short run: its first and last sixth


def test_a_task_is_flat_unless_the_last_median_is_both_half_again_and_a_fifth_of_a_second_slower():
    runs = [(t, 0.5) for t in range(0, 600, 10)] + [(t, 3.0) for t in range(600, 3000, 10)]  # the middle is ignored
    assert task_flatness("plan", runs + [(t, 0.7) for t in range(3000, 3600, 10)], 3600).flat  # 1.4x
    assert task_flatness("plan", [(t, 0.1) for t in range(0, 600, 10)] + [(t, 0.25) for t in range(3000, 3600, 10)],
                         3600).flat  # 2.5x but only 0.15 s slower
    grown = task_flatness("plan", runs + [(t, 0.8) for t in range(3000, 3600, 10)], 3600)
    assert not grown.flat and (grown.first, grown.last) == (0.5, 0.8) and grown.ratio == pytest.approx(1.6)
    assert task_flatness("plan", [(t, 0.5) for t in range(0, 600, 10)], 3600) is None  # no run late: no verdict


def test_memory_is_flat_within_ten_percent_either_way_after_the_warm_up():
    warm_up = [(t, 100.0 + t) for t in range(0, 300, 10)]  # grows fast in the first minutes: not compared
    baseline = [(t, 1000.0) for t in range(300, 600, 10)]
    middle = [(t, 5000.0) for t in range(600, 3300, 10)]

    def with_last(mb: float) -> bool:
        return memory_flatness("broker", warm_up + baseline + middle + [(t, mb) for t in range(3300, 3600, 10)],
                               3600).flat

    assert with_last(1090.0) and with_last(920.0)
    assert not with_last(1110.0) and not with_last(880.0)


def test_memory_is_compared_at_rest_so_that_task_processes_running_at_some_samples_do_not_count():
    """The scheduler's samples include the task processes its LocalExecutor runs, when one runs: 880 MB at rest,
    1,170 MB with a task. More samples with a task in the last window is not growth; a higher floor is."""
    def scheduler(last_busy_every: int, last_rest: float) -> bool:
        baseline = [(t, 1170.0 if t % 30 == 0 else 880.0) for t in range(300, 600, 10)]  # a task in a third
        last = [(t, 1170.0 if (t // 10) % last_busy_every == 0 else last_rest) for t in range(3300, 3600, 10)]
        return memory_flatness("scheduler", baseline + last, 3600).flat

    assert scheduler(last_busy_every=2, last_rest=886.0)  # a task in half the samples: the median moved, not the floor
    assert not scheduler(last_busy_every=2, last_rest=1000.0)  # what it keeps at rest grew 14 %


def test_the_ledger_bound_is_retention_plus_what_waits_for_the_next_prune_the_floor_and_the_runs_in_flight():
    assert ledger_bound(100, 50) == 153
    assert ledger_bound(100, 50, in_flight=0) == 151


# -- recovery --------------------------------------------------------------------------------------------------


def test_under_goal_is_the_nearest_rank_p99_of_the_records_visible_in_the_last_twenty_seconds():
    fresh = steady(0, 100, 1.0)  # 200 records in any 20 s
    for late in range(6):
        records = fresh + [(50.05 + i / 100, 30.0) for i in range(late)]
        in_window = sorted(latency for at, latency in records if 40 < at <= 60)
        expected = percentile(in_window, 0.99) <= 10
        assert under_goal(Visibility.of(records), 60, goal=10, window=20) is expected, late
    assert under_goal(Visibility.of(fresh + [(50.05, 30.0), (50.06, 30.0)]), 60, goal=10, window=20)  # 2 of 202
    three_late = Visibility.of(fresh + [(50.05, 30.0), (50.06, 30.0), (50.07, 30.0)])
    assert not under_goal(three_late, 60, goal=10, window=20)  # 3 of 203: the 201st of them is late
    assert under_goal(three_late, 72, goal=10, window=20)  # they left the window (52, 72]
    assert not under_goal(Visibility.of([(5.0, 1.0)]), 40, goal=10, window=20)  # nothing visible: not fresh


def test_recovery_runs_from_the_return_until_the_rolling_p99_is_under_the_goal_for_thirty_seconds():
    visibility = Visibility.of(steady(0, 100, 30.0) + steady(100, 300, 2.0))
    # (100, 120] holds only fresh records: under at 120, 30 s after the return at 90
    assert recovery_seconds(visibility, returned=90, until=300) == 30
    relapse = Visibility.of(steady(0, 100, 30.0) + steady(100, 130, 2.0) + steady(130, 131, 40.0)
                            + steady(131, 300, 2.0))
    assert recovery_seconds(relapse, returned=90, until=300) == 61  # (131, 151]: the relapse left the window
    assert recovery_seconds(visibility, returned=90, until=140) is None  # under from 120, but not for 30 s yet
    assert recovery_seconds(Visibility.of(steady(0, 300, 2.0)), returned=90, until=300) == 0  # never worse


def test_a_stall_with_nothing_visible_is_not_a_recovery():
    visibility = Visibility.of(steady(0, 100, 2.0) + steady(160, 300, 2.0))  # nothing visible in (100, 160)
    assert recovery_seconds(visibility, returned=100, until=300) == 60  # the first window with records again


# -- the benchmark's checks --------------------------------------------------------------------------------------


def run(start: float, plan: float = 0.5, notify: float = 0.5, state: str = "success", tries: int = 1) -> dict:
    return {"start": start, "state": state, "plan": plan, "write": 3.0, "notify_complete": notify,
            **{f"{t}_state": state for t in ("plan", "write", "notify_complete")},
            **{f"{t}_tries": tries for t in ("plan", "write", "notify_complete")}}


def test_failed_and_retried_task_instances_are_counted():
    assert failed_tasks([run(0), run(10, state="failed"), run(20, tries=2)]) == (3, 3)
    assert failed_tasks([run(0), run(10)]) == (0, 0)


def test_drift_checks_name_what_drifted():
    timeline = [run(t) for t in range(0, 3000, 10)] + [run(t, notify=2.0) for t in range(3000, 3600, 10)]
    samples = [{"t": t, "memory_mb": {"broker": 400.0, "connect server": 800.0 if t < 3300 else 2000.0},
                "ledger_batches": 150 if t < 3500 else 160} for t in range(0, 3600, 10)]
    ours = OursResult(None, {}, [], {}, {}, timeline=timeline)  # type: ignore[arg-type]
    checks = {c.name: c for c in drift_checks(ours, samples, 3600, retention_batches=100, restarted=set())}
    assert {name for name, c in checks.items() if not c.ok} == {"notify_complete flat", "connect server memory flat",
                                                                "ledger bounded"}
    assert checks["plan flat"].ok and checks["broker memory flat"].ok and checks["no failed task instance"].ok
    restarted = drift_checks(ours, samples, 3600, None, restarted={"connect server"})
    assert "connect server memory flat" not in {c.name for c in restarted}  # a restarted process is not compared


def test_a_fault_fails_when_freshness_is_not_back_within_sixty_seconds_of_the_return():
    checks = fault_checks([Fault("connect", 60, 60, 80, 45.0), Fault("scheduler", 120, 120, 130, 75.0),
                           Fault("broker", 180, 180, 220, None)], until=400)
    assert [c.ok for c in checks] == [True, False, False]
    assert "recovery 75 s" in checks[1].detail
    [late] = fault_checks([Fault("broker", 180, 180, 220, None)], until=260)  # 40 s left: cannot be confirmed
    assert late.ok and "unconfirmed" in late.detail
    [never] = fault_checks([Fault("broker", 180)], until=400)
    assert not never.ok and "not killed and back" in never.detail


# -- the fault injector ------------------------------------------------------------------------------------------


def test_faults_are_spaced_evenly_through_the_run():
    assert fault_offsets(3, 720) == [180, 360, 540]
    assert fault_offsets(1, 240) == [120]


class FakeComponent:
    def __init__(self, name: str, restart_seconds: float = 0.05, fails: bool = False) -> None:
        self.name, self.restart_seconds, self.fails = name, restart_seconds, fails
        self.events: list[str] = []

    def kill(self) -> None:
        self.events.append("kill")

    def start(self) -> None:
        time.sleep(self.restart_seconds)
        if self.fails:
            raise RuntimeError(f"{self.name} did not come back")
        self.events.append("start")


def test_the_injector_kills_each_component_once_at_its_moment_and_notes_its_down_time():
    connect, broker = FakeComponent("connect"), FakeComponent("broker", restart_seconds=0.2)
    injector = FaultInjector([connect, broker], seconds=0.9)
    injector.begin(time.time())
    injector.join(5)
    injector.check()
    assert connect.events == broker.events == ["kill", "start"]
    first, second = injector.faults
    assert first.killed == pytest.approx(0.3, abs=0.1) and second.killed == pytest.approx(0.6, abs=0.1)
    assert second.down_s == pytest.approx(0.2, abs=0.1) and second.down_s > first.down_s


def test_a_component_that_does_not_come_back_fails_the_run():
    injector = FaultInjector([FakeComponent("scheduler", fails=True)], seconds=0.1)
    injector.begin(time.time())
    injector.join(5)
    with pytest.raises(RuntimeError, match="scheduler did not come back"):
        injector.check()
    assert injector.faults[0].killed is not None and injector.faults[0].returned is None


# -- the figures -------------------------------------------------------------------------------------------------


def test_without_matplotlib_the_figures_say_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(PlotLibraryMissing, match=r"pip install airflow-exactly-once\[benchmarks\]") as raised:
        pyplot()
    assert raised.value.retriable is False and "make benchmark-freshness-hour" in str(raised.value)


def test_the_heap_in_use_is_survivors_eden_and_old_from_jstat_gc():
    """`jstat -gc`'s capacities (S0C, EC, OC...) and metaspace (MU) are not the heap in use: only the four U columns
    of the heap count (KB)."""
    output = (" S0C    S1C    S0U    S1U      EC       EU        OC         OU       MC     MU    CCSC   CCSU   YGC "
              "    YGCT     FGC    FGCT     CGC    CGCT       GCT   \n"
              "  0.0  4096.0   0.0  4096.0 614400.0  20480.0  430080.0   97280.0  52864.0 51616.4 6528.0 5921.2     12"
              "     0.095     0      0.000     4      0.011    0.106\n")
    assert heap_used_kb(output) == 4096.0 + 20480.0 + 97280.0
