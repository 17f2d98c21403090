"""A real Spark standalone cluster (one master, N workers) on 127.0.0.1, from pyspark's own jars.

Executors are JVMs that the worker launches, each with its own Python workers, so a job
meets what it meets on a real cluster except the network: code and jars must be shipped,
an executor can die on its own, the driver is another process. The master and workers are
the classes `sbin/start-master.sh` and `start-worker.sh` run, started with `spark-class`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from airflow_exactly_once.spark.packages import spark_home
from devtools.ports import reserve_port
from devtools.processes import check_alive, stop_session

# What each worker offers. docker/docker-compose.yml is generated with the same values.
WORKER_CORES = 2
WORKER_MEMORY = "2g"
DAEMON_MEMORY = "512m"
# What one write job asks for by default in tests, benchmarks and the docker stack:
# one-core executors, so `spark.cores.max` is the number of executors.
APP_CONF = {
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    "spark.cores.max": "2",
    "spark.ui.enabled": "false",
}
EXECUTOR_MAIN_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


class LocalSparkCluster:
    """Start and stop a standalone master and `workers` workers whose files live in `data_dir`."""

    def __init__(self, data_dir: str | Path, workers: int = 1, cores: int = WORKER_CORES,
                 memory: str = WORKER_MEMORY, master_port: int = 0, webui_port: int = 0) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.master_port = master_port or reserve_port()
        self.webui_port = webui_port or reserve_port()
        self.processes: dict[str, subprocess.Popen] = {}

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    @property
    def webui_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"

    def work_dir(self, worker: int = 0) -> Path:
        """Where worker `worker` keeps one folder per application and executor (their logs)."""
        return self.data_dir / f"worker-{worker}" / "work"

    def connection(self, deploy_mode: str = "client") -> dict[str, Any]:
        """An Airflow `spark` connection to this master (REST body or AIRFLOW_CONN_* JSON)."""
        return {"conn_type": "spark", "host": "spark://127.0.0.1", "port": self.master_port,
                "extra": json.dumps({"deploy-mode": deploy_mode})}

    # -- lifecycle -------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(self.data_dir / "conf"),  # empty: no stray spark-defaults.conf
            "SPARK_LOCAL_IP": "127.0.0.1",  # bind RPC and web UIs to loopback only
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON", sys.executable),
        })
        return env

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.data_dir / f"{name}.log", "ab")
        self.processes[name] = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args], env=self._env(), cwd=self.data_dir,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def start(self, timeout: float = 180.0) -> "LocalSparkCluster":
        (self.data_dir / "conf").mkdir(parents=True, exist_ok=True)
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.master_port), "--webui-port", str(self.webui_port))
        for n in range(self.workers):
            self.work_dir(n).mkdir(parents=True, exist_ok=True)
            self._spawn(f"worker-{n}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--port", str(reserve_port()), "--webui-port", str(reserve_port()),
                        "--cores", str(self.cores), "--memory", self.memory,
                        "--work-dir", str(self.work_dir(n)), self.master_url)
        (self.data_dir / "cluster.pids").write_text(" ".join(str(p.pid) for p in self.processes.values()))
        deadline = time.monotonic() + timeout
        alive = 0
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                alive = self.status().get("aliveworkers", 0)
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                alive = 0
            if alive >= self.workers:
                return self
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"the Spark master at {self.master_url} saw {alive} of {self.workers} workers after "
                           f"{timeout:.0f}s; see the logs in {self.data_dir}")

    def _check_alive(self) -> None:
        check_alive(self.processes, self.data_dir, "Spark")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop workers (and with them their executors) and the master."""
        for name in sorted(self.processes, reverse=True):  # workers before the master
            stop_session(self.processes[name], timeout)
        self.processes.clear()

    # -- what the master knows -------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The master's own JSON view: workers, cores, active and completed applications."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=10) as response:
            return json.loads(response.read().decode())

    def applications(self, name_contains: str = "", active_only: bool = False) -> list[dict[str, Any]]:
        status = self.status()
        apps = [*status.get("activeapps", []), *([] if active_only else status.get("completedapps", []))]
        return [app for app in apps if name_contains in app.get("name", "")]

    def executor_dirs(self, app_id: str) -> list[Path]:
        """One folder per executor the workers launched for `app_id` (replacements included)."""
        return sorted(p for n in range(self.workers) for p in (self.work_dir(n) / app_id).glob("*") if p.is_dir())

    @staticmethod
    def executor_pids(app_id: str) -> list[int]:
        """Executor JVMs of `app_id` that are running now."""
        import psutil

        pids = []
        for process in psutil.process_iter(["pid", "cmdline"]):
            cmdline = process.info.get("cmdline") or []
            if EXECUTOR_MAIN_CLASS in cmdline and app_id in cmdline:
                pids.append(process.info["pid"])
        return pids

    def __enter__(self) -> "LocalSparkCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_pidfile(data_dir: str | Path) -> bool:
    """Stop a cluster started by `python -m devtools spark-start`."""
    pidfile = Path(data_dir) / "cluster.pids"
    if not pidfile.exists():
        return False
    for pid in reversed([int(p) for p in pidfile.read_text().split()]):
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    pidfile.unlink()
    return True
