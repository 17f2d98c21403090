"""The freshness benchmark's figures, drawn from its series JSON (issue 51): latency over time with the goal and the
faults marked, plan / write / notify_complete of each run over time, and memory over time.

    PYTHONPATH=. python benchmarks/freshness_plots.py SERIES.json DIR [NAME]   # redraw a run's figures

matplotlib is an optional extra: `pip install airflow-exactly-once[benchmarks]` (the benchmark make targets install
it).
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from typing import Any

TASK_COLOURS = {"plan": "tab:blue", "write": "tab:green", "notify_complete": "tab:orange"}


class PlotLibraryMissing(RuntimeError):
    """matplotlib is not installed: the figures need the benchmarks extra."""

    retriable = False


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display), or PlotLibraryMissing saying what to install."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        raise PlotLibraryMissing("--plot needs matplotlib, which is not installed: run `pip install "
                                 "airflow-exactly-once[benchmarks]` (in a checkout: `make benchmark-freshness-hour` "
                                 "and `make benchmark-freshness-faults` install it), or leave out --plot") from None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def _mark_faults(axes: Any, series: dict[str, Any]) -> None:
    for fault in series.get("faults", []):
        if fault.get("killed") is not None:
            axes.axvline(fault["killed"] / 60, color="red", linestyle=":", linewidth=1)
            axes.annotate(f"{fault['component']} killed", (fault["killed"] / 60, 1), xycoords=("data", "axes fraction"),
                          rotation=90, va="top", ha="right", fontsize=7, color="red")
        if fault.get("returned") is not None:
            axes.axvline(fault["returned"] / 60, color="green", linestyle=":", linewidth=1)


def latency_figure(series: dict[str, Any], path: Path) -> None:
    """p50 and p99 of produced-to-visible per window with the goal line; below, each run's task durations."""
    plt = pyplot()
    figure, (latency, tasks) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, height_ratios=(3, 2))
    points = series["latency"]
    middles = [(p["t"] + series["window_s"] / 2) / 60 for p in points]  # each window at its middle
    for key in ("p50", "p99"):  # a window with nothing visible is a gap in the line (NaN), not a slope across it
        latency.plot(middles, [p.get(key, math.nan) for p in points], ".-", markersize=3, linewidth=1,
                     label=f"{key} per {series['window_s']:g} s window (gaps: nothing became visible)")
    latency.axhline(series["goal_s"], color="grey", linestyle="--", label=f"goal: p99 {series['goal_s']:g} s")
    _mark_faults(latency, series)
    latency.set_ylabel("produced to visible, s")
    latency.set_ylim(bottom=0)
    latency.legend(loc="best", fontsize=8)
    latency.set_title(f"Freshness at {series['rate']:g} records/s for {series['minutes']:g} min")
    for task, colour in TASK_COLOURS.items():
        runs = [r for r in series["runs"] if r.get(task) is not None]
        tasks.plot([r["start"] / 60 for r in runs], [r[task] for r in runs], ".", markersize=3, color=colour,
                   label=task)
    _mark_faults(tasks, series)
    tasks.set_ylabel("task duration, s")
    tasks.set_xlabel("minutes since the producer started (runs at their start)")
    tasks.set_ylim(bottom=0)
    tasks.legend(loc="best", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def memory_figure(series: dict[str, Any], path: Path) -> None:
    """Resident memory (with children) of each long-lived process over time; dashed, the Java heap in use of those
    that are JVMs (when the run sampled it)."""
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(11, 4.5))
    samples = series["samples"]
    names = sorted({name for sample in samples for name in sample["memory_mb"]})
    for name in names:
        line, = axes.plot([s["t"] / 60 for s in samples], [s["memory_mb"].get(name) for s in samples],
                          label=name, linewidth=1)
        heaps = [(s["t"] / 60, s["heap_mb"][name]) for s in samples if name in s.get("heap_mb", {})]
        if heaps:
            axes.plot(*zip(*heaps), linestyle="--", linewidth=0.8, color=line.get_color(),
                      label=f"{name}: Java heap in use")
    _mark_faults(axes, series)
    axes.set_ylabel("resident memory with children, MB")
    axes.set_xlabel("minutes since the producer started")
    axes.set_ylim(bottom=0)
    axes.legend(loc="best", fontsize=8)
    axes.set_title("Memory of the long-lived processes")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def draw(series: dict[str, Any], folder: Path, name: str) -> list[Path]:
    """Both figures as <name>-latency.png and <name>-memory.png in `folder`; their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{name}-latency.png", folder / f"{name}-memory.png"]
    latency_figure(series, paths[0])
    memory_figure(series, paths[1])
    return paths


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    series_file, folder = Path(argv[0]), Path(argv[1])
    try:
        paths = draw(json.loads(series_file.read_text()), folder, argv[2] if len(argv) == 3 else series_file.stem)
    except PlotLibraryMissing as exc:
        print(exc, file=sys.stderr)
        return 2
    print("\n".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
