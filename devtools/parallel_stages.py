"""Run independent test stages side by side, each with its own log, and fail if any failed.

    python -m devtools.parallel_stages [--logs DIR] NAME=COMMAND [NAME=COMMAND ...]

`make test` runs the stages after the primary pytest run this way (the Kafka 4 run, the newest
stack's subset, the install matrix, the 3-node Kafka cluster's tests): they share no port
(devtools.ports), no temporary folder (each
pytest session makes its own), and what they install or fetch is built before they start (the
Makefile's prerequisites), so running them at once only shortens the run.

Each COMMAND runs through `sh -c` in its own process group, its output (stdout and stderr) going to
DIR/NAME.log; interleaved output of three pytest sessions would be unreadable. When a stage ends
its whole log is printed in one piece, then a line with its result and duration. At the end a
table of every stage; for each failed stage its pytest summary (or the tail of its log) again, so
a failure is the last thing the CI log shows. Exit status 1 if any stage failed, 130 when
interrupted (the stages' process groups are ended first).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable

POLL_SECONDS = 0.5
TAIL_LINES = 60  # of a failed stage's log without a pytest summary
STOP_GRACE_SECONDS = 20.0  # for a stage's processes to exit on SIGTERM before SIGKILL


@dataclass
class Stage:
    """One command and what became of it."""

    name: str
    command: str
    log: Path
    process: subprocess.Popen | None = None
    started: float = 0.0
    seconds: float = 0.0
    returncode: int | None = None
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def passed(self) -> bool:
        return self.returncode == 0


def parse_stage(text: str, logs: Path) -> Stage:
    """NAME=COMMAND -> a Stage logging to logs/NAME.log."""
    name, sep, command = text.partition("=")
    name = name.strip()
    if not sep or not name or not command.strip() or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"stage {text!r}: write it as NAME=COMMAND, NAME of letters, digits, - and _ "
                         f"(e.g. kafka4='make stage-kafka4')")
    return Stage(name, command, logs / f"{name}.log")


def duration(seconds: float) -> str:
    """3 min 20 s, the way docs/testing.md writes run times."""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def failure_summary(log_text: str, tail_lines: int = TAIL_LINES) -> str:
    """What to show again of a failed stage: pytest's short test summary and final line, else the log's tail.

    pytest prints "= short test summary info =" (one line per failed test, with its reason) only when
    something failed; a stage that failed before or after pytest (a make error, a crash) has none.
    """
    lines = log_text.rstrip("\n").splitlines()
    for index in range(len(lines) - 1, -1, -1):
        if "short test summary info" in lines[index] and lines[index].startswith("="):
            return "\n".join(lines[index:])
    return "\n".join(lines[-tail_lines:])


def start(stage: Stage) -> None:
    stage.log.parent.mkdir(parents=True, exist_ok=True)
    stage._log_file = open(stage.log, "wb")
    stage.started = time.monotonic()
    # Its own session: the stage and everything it starts can be ended as one group.
    stage.process = subprocess.Popen(["sh", "-c", stage.command], stdout=stage._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)


def finish(stage: Stage, out: IO[str]) -> None:
    """Record the stage's end; print its log in one piece and its result."""
    assert stage.process is not None and stage._log_file is not None
    stage.returncode = stage.process.returncode
    stage.seconds = time.monotonic() - stage.started
    stage._log_file.close()
    result = "passed" if stage.passed else f"FAILED (exit status {stage.returncode})"
    out.write(f"\n===== stage {stage.name}: log ({stage.log}) =====\n")
    text = stage.log.read_text(errors="replace")
    out.write(text if text.endswith("\n") or not text else text + "\n")
    out.write(f"===== stage {stage.name}: {result} in {duration(stage.seconds)} =====\n")
    out.flush()


def stop(stages: list[Stage]) -> None:
    """End every running stage's process group: SIGTERM, then SIGKILL after STOP_GRACE_SECONDS."""
    running = [s for s in stages if s.process is not None and s.process.poll() is None]
    for stage in running:
        try:
            os.killpg(stage.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for stage in running:
        try:
            stage.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(stage.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            stage.process.wait()


def report(stages: list[Stage], wall_seconds: float, out: IO[str]) -> None:
    """The table of stages, then each failed stage's summary: the last thing the run prints."""
    width = max(len(s.name) for s in stages)
    out.write(f"\n===== {len(stages)} stages side by side in {duration(wall_seconds)} "
              f"(one after another: {duration(sum(s.seconds for s in stages))}) =====\n")
    for s in stages:
        result = "passed" if s.passed else f"FAILED (exit status {s.returncode})"
        out.write(f"  {s.name:<{width}}  {duration(s.seconds):>12}  {result}  log: {s.log}\n")
    for s in stages:
        if not s.passed:
            out.write(f"\n===== stage {s.name} FAILED; its summary (whole log above and in {s.log}) =====\n")
            out.write(failure_summary(s.log.read_text(errors="replace")) + "\n")
    out.flush()


def run(stages: list[Stage], out: IO[str] = sys.stdout, pause: Callable[[float], None] = time.sleep) -> int:
    """Start every stage at once, print each as it ends; 0 only if every stage exited 0.

    `pause` waits between polls; a test interrupts the run through it without touching `time.sleep`,
    which other threads of the same process (py4j's, for one) also call."""
    started = time.monotonic()
    for stage in stages:
        start(stage)
        out.write(f"started stage {stage.name} (pid {stage.process.pid}): {stage.command}\n")
    out.flush()
    try:
        pending = list(stages)
        while pending:
            for stage in [s for s in pending if s.process.poll() is not None]:
                finish(stage, out)
                pending.remove(stage)
            if pending:
                pause(POLL_SECONDS)
    except KeyboardInterrupt:
        stop(stages)
        out.write("\ninterrupted: every stage's processes were ended\n")
        return 130
    report(stages, time.monotonic() - started, out)
    return 0 if all(s.passed for s in stages) else 1


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the same clean-up as Ctrl-C when make or CI ends this process


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.parallel_stages",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", default="artifacts/stages", help="folder for the stages' logs (NAME.log)")
    parser.add_argument("stages", nargs="+", metavar="NAME=COMMAND")
    args = parser.parse_args(argv)
    try:
        stages = [parse_stage(text, Path(args.logs)) for text in args.stages]
    except ValueError as exc:
        parser.error(str(exc))
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        parser.error(f"stage names must differ (they name the logs): {names}")
    signal.signal(signal.SIGTERM, _terminated)
    return run(stages)


if __name__ == "__main__":
    sys.exit(main())
