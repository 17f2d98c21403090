"""The `pause` fault action: the process stops at the point and, once continued, goes on as if nothing happened
(tests/integration/test_kafka_cluster.py kills a Kafka node meanwhile); `stop` fails the step once continued."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from airflow_exactly_once.core.faults import ENV, arm

REACH_POINT = ("from airflow_exactly_once.core.faults import fault_point\n"
               "fault_point('write.after_stage')\n"
               "print('went on')\n")


def reach_point(folder, action: str) -> subprocess.CompletedProcess:
    arm(folder, "write.after_stage", action)
    process = subprocess.Popen([sys.executable, "-c", REACH_POINT], env={**os.environ, ENV: str(folder)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while psutil.Process(process.pid).status() != psutil.STATUS_STOPPED:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the process never stopped at the point"
        time.sleep(0.05)
    assert f"write.after_stage {action} pid={process.pid}" in (folder / "fired.log").read_text()
    os.kill(process.pid, signal.SIGCONT)
    out, err = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_a_paused_process_goes_on_once_continued(tmp_path):
    done = reach_point(tmp_path, "pause")
    assert (done.returncode, done.stdout) == (0, "went on\n")


def test_a_stopped_process_fails_the_step_once_continued(tmp_path):
    done = reach_point(tmp_path, "stop")
    assert done.returncode == 1 and "InjectedFault: injected fault at write.after_stage" in done.stderr
