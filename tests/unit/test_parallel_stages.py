"""devtools/parallel_stages.py: the stages after `make test`'s primary run, side by side. A failure of any
stage fails the run and is shown with its reason; no stage's output mixes with another's."""

from __future__ import annotations

import io
import os
import time

import psutil
import pytest

from devtools.parallel_stages import Stage, failure_summary, parse_stage, run

PYTEST_FAILURE_LOG = """\
....F.
=================================== FAILURES ===================================
___________________________ test_commits_once ___________________________
    assert 2 == 1
E   assert 2 == 1
=========================== short test summary info ============================
FAILED tests/integration/test_kafka_sink.py::test_commits_once - assert 2 == 1
========================= 1 failed, 5 passed in 12.34s =========================
"""


def stages(tmp_path, **commands: str) -> list[Stage]:
    return [parse_stage(f"{name}={command}", tmp_path / "logs") for name, command in commands.items()]


def test_every_stage_runs_at_once_and_a_failing_one_fails_the_run_with_its_summary_last(tmp_path):
    log = tmp_path / "pytest-output.txt"
    log.write_text(PYTEST_FAILURE_LOG)
    out = io.StringIO()
    started = time.monotonic()
    status = run(stages(tmp_path, slow_a="sleep 1; echo A_OUT", slow_b="sleep 1; echo B_OUT",
                        broken=f"cat {log}; exit 1"), out)
    elapsed = time.monotonic() - started
    assert status == 1
    assert elapsed < 1.9, f"the two 1 s stages ran one after the other ({elapsed:.1f} s)"
    text = out.getvalue()
    assert "stage broken: FAILED (exit status 1)" in text and "stage slow_a: passed" in text
    assert (tmp_path / "logs" / "slow_a.log").read_text() == "A_OUT\n"
    # Each log is printed whole, in one piece, between its own header and result line.
    assert text.index("===== stage slow_b: log") < text.rindex("B_OUT") < text.index("===== stage slow_b: passed")
    # The failed test's line is the last thing printed.
    assert text.rstrip().endswith("========================= 1 failed, 5 passed in 12.34s =========================")
    assert text.rstrip().splitlines()[-2].startswith("FAILED tests/integration/test_kafka_sink.py::test_commits_once")


def test_the_run_passes_only_when_every_stage_exits_zero(tmp_path):
    assert run(stages(tmp_path, a="true", b="echo fine"), io.StringIO()) == 0
    assert run(stages(tmp_path, a="true", b="exit 2"), io.StringIO()) == 1


def test_a_stage_without_a_pytest_summary_shows_the_tail_of_its_log():
    log = "\n".join(f"line {n}" for n in range(200)) + "\nmake: *** [Makefile:9: stage-newest] Error 2\n"
    summary = failure_summary(log, tail_lines=5)
    assert summary.splitlines() == ["line 196", "line 197", "line 198", "line 199",
                                    "make: *** [Makefile:9: stage-newest] Error 2"]
    assert failure_summary(PYTEST_FAILURE_LOG).startswith("=========================== short test summary info")


def test_an_interrupted_run_ends_every_stage_process_group(tmp_path):
    marker = tmp_path / "still-running"
    polls = iter(range(1000))

    def interrupt_on_second_poll(seconds: float) -> None:
        if next(polls) == 1:
            raise KeyboardInterrupt
        time.sleep(seconds)

    # The child of the stage's shell must end too, not only the shell.
    job = stages(tmp_path, long=f"sh -c 'sleep 30; touch {marker}' & wait")
    assert run(job, io.StringIO(), pause=interrupt_on_second_poll) == 130
    assert job[0].process.returncode is not None
    time.sleep(0.2)
    assert not marker.exists()
    group = job[0].process.pid
    alive = []
    for process in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(process.pid) == group and process.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    assert alive == [], "processes of the interrupted stage are still running"


@pytest.mark.parametrize("text", ["noequals", "=make x", "bad name=make x", "name=  "])
def test_a_stage_must_be_named_and_have_a_command(text, tmp_path):
    with pytest.raises(ValueError, match="NAME=COMMAND"):
        parse_stage(text, tmp_path)
