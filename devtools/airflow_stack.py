"""A real Airflow 3 (scheduler, dag-processor, api-server, LocalExecutor or Celery workers) on 127.0.0.1.

Tests and the demo drive it through Airflow's REST API, the same calls the UI makes for
"Trigger", "Clear" and "Backfill", so retries, clears and task-process deaths are
handled by Airflow itself, not by a stand-in. With `celery=CeleryWorkers(...)` the tasks run on
Celery workers instead (`airflow celery worker`), each with its own AIRFLOW_HOME and working directory, as
on machines of their own; they share only what such machines share: the DAG folder, the metadata
database, the broker and the environment the stack passes on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from devtools.ports import reserve_port
from devtools.postgres import LocalPostgres
from devtools.processes import check_alive, marked_processes, stop_session

REPO = Path(__file__).resolve().parents[1]
FINISHED = {"success", "failed"}
# Without `database_url` the stack's metadata database is SQLite (AIRFLOW_HOME/airflow.db): wait up to a minute
# for its write lock instead of failing after sqlite3's default 5 s ("database is locked"), which a loaded machine
# exceeds. SQLite still refuses at once a write that would deadlock (a read transaction upgrading to a write while
# another process writes): fine for the demo, not for a test suite that posts backfills beside a busy scheduler.
SQLITE_CONNECT_ARGS = {"timeout": 60}
METADATA_DATABASE = "airflow"  # the database metadata_server creates for Airflow
# A Celery worker's name: what Airflow records as its task instances' `hostname` (worker_hostname below), since
# the stack's workers share one machine and so one real host name.
WORKER_NAME_ENV = "AIRFLOW_EXACTLY_ONCE_WORKER_NAME"


def worker_hostname() -> str:
    """`[core] hostname_callable` of the stack's Celery workers: the worker's name (WORKER_NAME_ENV)."""
    return os.environ[WORKER_NAME_ENV]


@dataclass(frozen=True)
class CeleryWorkers:
    """The Celery side of a stack: the broker, and each worker's name with the queues it serves."""

    broker_url: str
    queues: dict[str, tuple[str, ...]]
    concurrency: int = 1  # task slots per worker


def metadata_server(folder: Path) -> LocalPostgres:
    """A PostgreSQL server of its own for Airflow's metadata (database METADATA_DATABASE), started; pass
    `server.url(METADATA_DATABASE)` as the stack's `database_url`. As platforms run Airflow: on SQLite a request
    that reads before it writes (the UI's Backfill) fails at once with "database is locked" while the scheduler
    writes. No prepared transactions: Airflow uses none."""
    server = LocalPostgres(folder, max_prepared_transactions=0).start()
    server.create_database(METADATA_DATABASE)
    return server


class AirflowStack:
    """`triggerer=True` adds Airflow's triggerer (deferred tasks, Asset watchers: event-driven runs).
    `component_env`: environment of one component over `extra_env`, e.g. {"triggerer": {...}} (the scheduler's
    reaches the tasks: LocalExecutor runs them in its children). `reparse_seconds`: how often the dag-processor
    parses each DAG file again (Airflow's min_file_process_interval); new files are found every 3 s either way.
    `database_url`: Airflow's metadata database (SQLAlchemy URL, e.g. a PostgreSQL database, as production runs it);
    None keeps SQLite in AIRFLOW_HOME. `executor`: `[core] executor` (e.g. "LocalExecutor,CeleryExecutor": several at
    once, a task picks one with `executor=`). `celery`: the Celery workers to start (needs `database_url`: Celery's
    result backend is that database); `executor` then defaults to "CeleryExecutor"."""

    def __init__(self, root: str | Path, dag_files: list[Path], extra_env: dict[str, str] | None = None,
                 parallelism: int = 4, triggerer: bool = False,
                 component_env: dict[str, dict[str, str]] | None = None, reparse_seconds: int = 30,
                 database_url: str | None = None, executor: str | None = None,
                 celery: CeleryWorkers | None = None) -> None:
        if celery is not None and not database_url:
            raise ValueError("Celery workers need the metadata database on a server (database_url): Celery's result "
                             "backend is that database, which every worker reaches")
        self.root = Path(root)
        self.home = self.root / "airflow-home"
        self.dags_folder = self.root / "dags"
        self.dag_files = dag_files
        self.port = reserve_port()
        # The scheduler's and triggerer's log servers listen on fixed ports (8793, 8794) by default:
        # two stacks at once (the demo beside a test run) would collide there.
        self.log_server_ports = (reserve_port(), reserve_port())
        self.extra_env = extra_env or {}
        self.component_env = component_env or {}
        self.reparse_seconds = reparse_seconds
        self.database_url = database_url
        self.parallelism = parallelism
        self.executor = executor or ("CeleryExecutor" if celery else "LocalExecutor")
        self.celery = celery
        self.components = ("api-server", "scheduler", "dag-processor") + (("triggerer",) if triggerer else ())
        self.processes: dict[str, subprocess.Popen] = {}
        self._token: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": self.executor,
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__AUTH_MANAGER":
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__BASE_URL": self.base_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base_url}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": "exactly-once-local-stack-jwt-secret-0123456789",
            "AIRFLOW__API__SECRET_KEY": "exactly-once-local-stack",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "3",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": str(self.reparse_seconds),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_SEC": "2",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.log_server_ports[0]),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.log_server_ports[1]),
            "PYTHONUNBUFFERED": "1",
        })
        if self.database_url:
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = self.database_url
        else:
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS"] = f"{__name__}.SQLITE_CONNECT_ARGS"
        if self.celery:
            env.update({"AIRFLOW__CELERY__BROKER_URL": self.celery.broker_url,
                        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + self.database_url.replace("+psycopg2", "")})
        env.update(self.extra_env)
        # The stack's processes import this module (SQL_ALCHEMY_CONNECT_ARGS above): the repository's
        # root, where devtools lives, must be on their path whoever started the stack.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(REPO)) if p)
        return env

    def _airflow(self) -> str:
        return str(Path(sys.executable).with_name("airflow"))

    def start(self, timeout: float = 180.0) -> "AirflowStack":
        self.home.mkdir(parents=True, exist_ok=True)
        self.dags_folder.mkdir(parents=True, exist_ok=True)
        for path in self.dag_files:
            target = self.dags_folder / path.name
            if not target.exists():
                target.symlink_to(path.resolve())
        self.cli(["db", "migrate"])
        for name in self.components:
            self._spawn(name, [self._airflow(), name], {**self.env(), **self.component_env.get(name, {})})
        for worker in (self.celery.queues if self.celery else ()):
            self.start_worker(worker, timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                self._token = json.loads(self._raw("GET", "/auth/token"))["access_token"]
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(1)
        self.stop()
        raise RuntimeError(f"Airflow's api-server did not answer on {self.base_url} in {timeout:.0f}s; "
                           f"see {self.home}/api-server.log")

    # -- Celery workers --------------------------------------------------------------

    def worker_folder(self, worker: str) -> Path:
        """A Celery worker's machine, as far as the stack is concerned: its AIRFLOW_HOME and working directory."""
        return self.root / "workers" / worker

    def worker_home(self, worker: str) -> Path:
        """The worker's own AIRFLOW_HOME (its task logs land in its `logs/`), empty when the worker first starts."""
        return self.worker_folder(worker) / "airflow-home"

    def worker_env(self, worker: str) -> dict[str, str]:
        return {**self.env(), **self.component_env.get("worker", {}), "AIRFLOW_HOME": str(self.worker_home(worker)),
                WORKER_NAME_ENV: worker, "AIRFLOW__CORE__HOSTNAME_CALLABLE": f"{__name__}.worker_hostname"}

    def start_worker(self, worker: str, timeout: float = 180.0, fresh: bool = False) -> None:
        """`airflow celery worker` serving the worker's queues, started in its working directory; returns once Celery
        says it is ready. `fresh`: its AIRFLOW_HOME and working directory emptied first (a new machine); else it
        comes back on what it had (the same machine restarted). No log server: two workers of one machine would
        share its port, and the tests read the task logs from the worker's AIRFLOW_HOME."""
        assert self.celery is not None, "the stack has no Celery workers (celery=CeleryWorkers(...))"
        folder = self.worker_folder(worker)
        if fresh:
            shutil.rmtree(folder, ignore_errors=True)
        self.worker_home(worker).mkdir(parents=True, exist_ok=True)
        (folder / "work").mkdir(exist_ok=True)
        name = f"celery-{worker}"
        log_size = len(self.log_text(name))
        argv = [self._airflow(), "celery", "worker", "--queues", ",".join(self.celery.queues[worker]),
                "--concurrency", str(self.celery.concurrency), "--celery-hostname", f"{worker}@%h",
                "--skip-serve-logs", "--without-mingle", "--without-gossip"]
        with open(self.home / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(argv, env=self.worker_env(worker), cwd=folder / "work",
                                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            if f"{worker}@" in self.log_text(name)[log_size:] and " ready." in self.log_text(name)[log_size:]:
                return
            time.sleep(0.5)
        raise RuntimeError(f"Celery worker {worker} was not ready in {timeout:.0f}s (broker "
                           f"{self.celery.broker_url}); see {self.home}/{name}.log")

    def kill_worker(self, worker: str) -> None:
        """SIGKILL a Celery worker with everything it started (its pool, the task supervisors and task processes):
        a machine lost at once. Nothing of it runs a shutdown hook or tells Airflow."""
        process = self.processes.pop(f"celery-{worker}")
        group = [p for p in psutil.process_iter() if _process_group(p) == process.pid]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 30
        while alive := [p for p in group if _running(p)]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Celery worker {worker}: processes outlived SIGKILL: {alive}")
            time.sleep(0.1)

    def cli(self, args: list[str], env: dict[str, str] | None = None, timeout: float = 300.0) -> str:
        """`airflow <args>` on this stack's home and database, with `env` on top; its output.

        As an operator runs it beside the running stack (e.g. FAB's `fab-db migrate`, `sync-perm`, `users create`).
        """
        done = subprocess.run([self._airflow(), *args], env={**self.env(), **(env or {})}, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"`airflow {' '.join(args)}` failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n"
                               f"{done.stderr[-3000:]}")
        return done.stdout

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        with open(self.home / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                    start_new_session=True)
        return self.processes[name]

    def start_api_server(self, name: str, env: dict[str, str], timeout: float = 180.0) -> str:
        """Another api-server on this stack's home and database, with `env` on top (e.g. another auth manager).

        Returns its base URL; it stops with the stack. Its log is <home>/<name>.log.
        """
        port = reserve_port()
        base_url = f"http://127.0.0.1:{port}"
        self._spawn(name, [self._airflow(), "api-server"], {
            **self.env(), "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__BASE_URL": base_url, **env})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(f"{base_url}/api/v2/monitor/health", timeout=10):
                    return base_url
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(1)
        raise RuntimeError(f"the api-server {name} did not answer on {base_url} in {timeout:.0f}s; "
                           f"see {self.home}/{name}.log")

    def log_text(self, name: str) -> str:
        """What a component (api-server, scheduler, triggerer, ...) wrote to its log so far."""
        path = self.home / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _check_alive(self) -> None:
        check_alive(self.processes, self.home, "airflow")

    def stop(self) -> None:
        for process in self.processes.values():
            stop_session(process, 20)
        self.processes.clear()

    # -- REST API (what the UI calls) ----------------------------------------------

    def _raw(self, method: str, path: str, body: Any = None) -> str:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.read().decode()

    def api(self, method: str, path: str, body: Any = None) -> Any:
        log_size = len(self.log_text("api-server"))
        try:
            text = self._raw(method, "/api/v2" + path, body)
        except urllib.error.HTTPError as exc:
            message = f"{method} {path} -> {exc.code}: {exc.read().decode(errors='replace')[:2000]}"
            if exc.code >= 500:  # the api-server's traceback says why; the response only says "Internal Server Error"
                time.sleep(1)  # uvicorn logs the traceback after it sent the response
                message += f"\napi-server.log meanwhile:\n{self.log_text('api-server')[log_size:][-4000:]}"
            raise RuntimeError(message) from exc
        return json.loads(text) if text else None

    def wait_for_dag(self, dag_id: str, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                dag = self.api("GET", f"/dags/{dag_id}")
                if dag.get("is_paused"):
                    self.api("PATCH", f"/dags/{dag_id}", {"is_paused": False})
                return
            except RuntimeError as exc:
                last = str(exc)
                time.sleep(1)
        errors = self.api("GET", "/importErrors")
        raise RuntimeError(f"DAG {dag_id} was not parsed in {timeout:.0f}s ({last}); import errors: {errors}")

    def trigger(self, dag_id: str, run_id: str, conf: dict | None = None, logical_date: str | None = None) -> str:
        body = {"dag_run_id": run_id, "logical_date": logical_date, "conf": conf or {}}
        return self.api("POST", f"/dags/{dag_id}/dagRuns", body)["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 600.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            state = self.run_state(dag_id, run_id)
            if state in FINISHED:
                return state
            time.sleep(1)
        raise TimeoutError(f"run {run_id} of {dag_id} did not finish in {timeout:.0f}s; tasks: "
                           f"{self.task_states(dag_id, run_id)}")

    def run(self, dag_id: str, run_id: str, conf: dict | None = None, timeout: float = 600.0) -> str:
        self.trigger(dag_id, run_id, conf)
        return self.wait_run(dag_id, run_id, timeout)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, tuple[str | None, int]]:
        tis = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {ti["task_id"].rpartition(".")[2]: (ti["state"], ti["try_number"]) for ti in tis}

    def clear(self, dag_id: str, run_id: str, only_failed: bool = False, task_ids: list[str] | None = None) -> None:
        """What "Clear" on a DAG run (or on some of its tasks) does in the UI: they run again, same run id.

        Checks that the run is no longer finished when it returns, so that a `wait_run` after it
        waits for the new attempt and never returns the outcome of the old one.
        """
        self.api("POST", f"/dags/{dag_id}/clearTaskInstances",
                 {"dag_run_id": run_id, "dry_run": False, "only_failed": only_failed, "reset_dag_runs": True,
                  **({"task_ids": task_ids} if task_ids else {})})
        state = self.run_state(dag_id, run_id)
        if state in FINISHED:
            raise RuntimeError(f"run {run_id} of {dag_id} is still {state} after clearing it")

    @staticmethod
    def run_processes(run_id: str, grace_s: float = 15.0) -> list[str]:
        """Processes a run's tasks started that are still alive `grace_s` after the caller asks (Airflow exports
        AIRFLOW_CTX_DAG_RUN_ID to a task's environment, so its Spark JVM and Python workers carry it)."""
        deadline = time.monotonic() + grace_s
        while True:
            alive = marked_processes("AIRFLOW_CTX_DAG_RUN_ID", run_id)
            if not alive or time.monotonic() > deadline:
                return [f"pid {p.pid}: {' '.join(p.cmdline())[:200]}" for p in alive if p.is_running()]
            time.sleep(0.5)

    def put_connection(self, conn_id: str, conn: dict[str, Any]) -> None:
        """Create or replace a connection, as Admin -> Connections does (`conn`: conn_type, host, ...)."""
        body = {"connection_id": conn_id, **conn}
        try:
            self.api("POST", "/connections", body)
        except RuntimeError as exc:
            if "409" not in str(exc):
                raise
            self.api("PATCH", f"/connections/{conn_id}", body)

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        """The DAG's runs, oldest first (what the Runs tab lists)."""
        return self.api("GET", f"/dags/{dag_id}/dagRuns?order_by=run_after&limit=100")["dag_runs"]

    def task_log(self, dag_id: str, run_id: str, task_id: str) -> str:
        """All attempts' logs of a task (matched by the last part of its id), as one text."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
        texts = [p.read_text(errors="replace") for p in sorted(folder.glob(f"task_id=*{task_id}*/attempt=*.log"))]
        return "\n".join(texts)

    def __enter__(self) -> "AirflowStack":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _process_group(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except (ProcessLookupError, PermissionError):
        return None


def _running(process: psutil.Process) -> bool:
    """Alive and not a zombie (a SIGKILLed orphan waits for init to reap it, but runs no more)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def login(base_url: str, username: str, password: str) -> str:
    """A user's JWT, as the login form gets it (POST /auth/token: SimpleAuthManager's and FAB's alike)."""
    request = urllib.request.Request(f"{base_url}/auth/token", method="POST",
                                     data=json.dumps({"username": username, "password": password}).encode())
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read().decode())["access_token"]
