"""A real PostgreSQL server on 127.0.0.1, for tests and the demo.

It runs Debian's own server binaries (``/usr/lib/postgresql/<version>/bin``), in a
data directory of our choosing, with ``max_prepared_transactions`` switched on so
``PREPARE TRANSACTION`` works. Nothing here is a mock.

Running as root
---------------
``initdb`` and ``postgres`` refuse to run as root (a safety rule of PostgreSQL's,
not a configuration issue). When this process is root (as in the dev container),
every server-side command (``initdb``, ``pg_ctl``, and through it ``postgres``) is
run as an unprivileged system user instead: ``postgres`` by default, which the
Debian ``postgresql`` package creates (override with the ``os_user`` argument or
``AIRFLOW_EXACTLY_ONCE_PG_OS_USER``). The switch is done with ``setpriv`` (util-linux,
no PAM session; ``runuser -u`` if ``setpriv`` is missing). For that to work:

* the data directory is created by us and ``chown``-ed to that user, mode 0700
  (PostgreSQL insists on it);
* the user must be able to *traverse* every parent directory of the data directory.
  Pytest's ``/tmp/pytest-of-root`` and ``/root`` are mode 0700, so when a parent is
  not traversable we add the search (``x``) bit for it (``chmod o+x``, or ``g+x``
  when the user is in the directory's group). That lets the user pass through the
  directory by name; it does not let anyone list or read it. A warning names each
  directory changed.

Client commands (``psql``, ``pg_isready``) run as the calling user: they connect
over TCP with trust authentication, so who runs them does not matter.

Not for production: authentication is ``trust`` for everyone on 127.0.0.1 and
``fsync`` is off.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

from devtools.ports import reserve_port

SUPERUSER = "postgres"
BINDIR_ENV = "AIRFLOW_EXACTLY_ONCE_PG_BINDIR"
OS_USER_ENV = "AIRFLOW_EXACTLY_ONCE_PG_OS_USER"
_SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
_CONF_NAME = "airflow_exactly_once.conf"
# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
_MAX_SOCKET_PATH = 107


def _version_key(path: Path) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.]", path.parent.name))


def find_server_bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or None if there is none.

    Looks at ``$AIRFLOW_EXACTLY_ONCE_PG_BINDIR``, then Debian's
    ``/usr/lib/postgresql/<version>/bin`` (newest version first), then ``PATH``.
    """
    candidates: list[Path] = []
    if os.environ.get(BINDIR_ENV):
        candidates.append(Path(os.environ[BINDIR_ENV]))
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    candidates.extend(debian)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for bindir in candidates:
        if all(os.access(bindir / name, os.X_OK) for name in _SERVER_BINARIES):
            return bindir
    return None


def ensure_postgres_installed() -> Path:
    """Return the server's bin directory, installing Debian's ``postgresql`` package if needed.

    Installing needs root and ``apt-get`` (it runs ``apt-get update`` first, with
    ``DEBIAN_FRONTEND=noninteractive``). Raises RuntimeError naming the fix when the
    binaries are missing and cannot be installed here.
    """
    bindir = find_server_bindir()
    if bindir is not None:
        return bindir
    fix = (
        "Install the PostgreSQL server: `sudo apt-get install postgresql` on Debian/Ubuntu "
        f"(or your platform's server package), or point {BINDIR_ENV} at the directory "
        "holding initdb, pg_ctl and postgres."
    )
    apt_get = shutil.which("apt-get")
    if apt_get is None:
        raise RuntimeError(f"PostgreSQL server binaries (initdb, pg_ctl, postgres) not found and apt-get is "
                           f"not available to install them. {fix}")
    if os.geteuid() != 0:
        raise RuntimeError(f"PostgreSQL server binaries (initdb, pg_ctl, postgres) not found, and installing "
                           f"them needs root. {fix}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in ([apt_get, "update"],
                [apt_get, "install", "-y", "--no-install-recommends", "postgresql"]):
        result = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed with exit code {result.returncode}:\n"
                               f"{result.stdout[-3000:]}\n{fix}")
    bindir = find_server_bindir()
    if bindir is None:
        raise RuntimeError(f"Installed the `postgresql` package but still found no initdb/pg_ctl/postgres "
                           f"under /usr/lib/postgresql/*/bin. {fix}")
    return bindir


class LocalPostgres:
    """Start, stop and restart one PostgreSQL server whose files live in ``data_dir``.

    Layout: ``data_dir/pgdata`` (the cluster), ``data_dir/postgres.log`` (server log),
    ``data_dir/run`` (the Unix socket). The server listens on 127.0.0.1:``port``
    (0 picks a free port once, kept across restarts), has a superuser ``postgres``
    with trust authentication and UTF8 encoding, and allows
    ``max_prepared_transactions`` prepared transactions (0 disables two-phase commit,
    as PostgreSQL's own default does). See the module docstring for running as root.
    """

    def __init__(
        self,
        data_dir: str | Path,
        port: int = 0,
        max_prepared_transactions: int = 20,
        extra_config: dict[str, str] | None = None,
        os_user: str | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.port = port or reserve_port()
        self.max_prepared_transactions = max_prepared_transactions
        self.extra_config = extra_config or {}
        self.os_user = os_user or os.environ.get(OS_USER_ENV) or "postgres"
        self._bindir: Path | None = None

    # -- paths and URLs -------------------------------------------------------------

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        run = self.data_dir / "run"
        if len(str(run / f".s.PGSQL.{self.port}")) <= _MAX_SOCKET_PATH:
            return run
        # Too long for a Unix socket path: use a short directory named after data_dir.
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"aeo-pg-{digest}"

    @property
    def bindir(self) -> Path:
        if self._bindir is None:
            self._bindir = ensure_postgres_installed()
        return self._bindir

    def url(self, dbname: str = "postgres") -> str:
        """A SQLAlchemy URL: ``postgresql+psycopg2://postgres@127.0.0.1:PORT/dbname``."""
        return f"postgresql+psycopg2://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq URL (what ``psycopg2.connect`` and ``psql`` take)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    # -- running commands as the server's user ---------------------------------------

    def _as_server_user(self, cmd: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return cmd
        user = self._server_user()
        if shutil.which("setpriv"):
            return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--init-groups", *cmd]
        if shutil.which("runuser"):
            return ["runuser", "-u", user.pw_name, "--", *cmd]
        raise RuntimeError("Running as root, and neither setpriv nor runuser (util-linux) is available to "
                           "run PostgreSQL as an unprivileged user. Install util-linux or run as non-root.")

    def _server_user(self) -> pwd.struct_passwd:
        try:
            return pwd.getpwnam(self.os_user)
        except KeyError:
            raise RuntimeError(
                f"Running as root, PostgreSQL must run as an unprivileged user, and user "
                f"{self.os_user!r} does not exist. The Debian `postgresql` package creates `postgres`; "
                f"otherwise create one (`useradd --system {self.os_user}`) or set {OS_USER_ENV}."
            ) from None

    def _server_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        if os.geteuid() == 0:
            env["HOME"] = self._server_user().pw_dir
        return env

    def _run(self, cmd: list[str], check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        result = subprocess.run(
            self._as_server_user(cmd), cwd=self.data_dir, env=self._server_env(),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed with exit code {result.returncode}:\n{result.stdout}"
                               + self._log_tail())
        return result

    def _log_tail(self, chars: int = 3000) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return f"\n--- last lines of {self.log_file} ---\n{text[-chars:]}"

    def _prepare_dirs(self) -> None:
        dirs = [self.data_dir, self.socket_dir]
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            for d in dirs:
                os.chmod(d, 0o700)
            return
        user = self._server_user()
        for d in dirs:
            _grant_traverse(d.parent, user)
            os.chown(d, user.pw_uid, user.pw_gid)
            os.chmod(d, 0o700)
        # Files a previous root-run process may have left (e.g. a log file) must be the user's.
        for path in self.data_dir.iterdir():
            if path.name != "pgdata" and path.stat().st_uid != user.pw_uid:
                os.chown(path, user.pw_uid, user.pw_gid)

    def _config(self) -> dict[str, str]:
        config = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_prepared_transactions": str(self.max_prepared_transactions),
            "max_connections": "100",
            "shared_buffers": "64MB",
            # A throwaway server: survive a server crash (prepared transactions are in
            # the WAL, which the OS page cache keeps), not a machine crash.
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "logging_collector": "off",
            "log_min_messages": "warning",
        }
        config.update(self.extra_config)
        return config

    def _write_config(self) -> None:
        conf = self.pgdata / _CONF_NAME
        conf.write_text("# Written by devtools.postgres on every start.\n"
                        + "".join(f"{k} = {v}\n" for k, v in self._config().items()))
        if os.geteuid() == 0:
            user = self._server_user()
            os.chown(conf, user.pw_uid, user.pw_gid)
        main_conf = self.pgdata / "postgresql.conf"
        include = f"include_if_exists = '{_CONF_NAME}'\n"
        if include not in main_conf.read_text():
            with main_conf.open("a") as f:
                f.write("\n" + include)

    # -- lifecycle -------------------------------------------------------------------

    def is_running(self) -> bool:
        if not (self.pgdata / "PG_VERSION").exists():
            return False
        return self._run([str(self.bindir / "pg_ctl"), "-D", str(self.pgdata), "status"], check=False).returncode == 0

    def start(self, timeout: float = 60.0) -> "LocalPostgres":
        bindir = self.bindir
        self._prepare_dirs()
        if not (self.pgdata / "PG_VERSION").exists():
            if self.pgdata.exists():
                shutil.rmtree(self.pgdata)  # a half-finished initdb
            self._run([str(bindir / "initdb"), "-D", str(self.pgdata), "-U", SUPERUSER, "--auth=trust",
                       "--encoding=UTF8", "--locale=C", "--no-sync"])
        self._write_config()
        started = self._run([str(bindir / "pg_ctl"), "-D", str(self.pgdata), "-l", str(self.log_file),
                             "-w", "-t", str(int(timeout)), "start"], check=False, timeout=timeout + 30)
        if started.returncode != 0:
            raise RuntimeError(f"PostgreSQL did not start (pg_ctl exit code {started.returncode}) on "
                               f"127.0.0.1:{self.port}, data in {self.pgdata}:\n{started.stdout}" + self._log_tail())
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            probe = subprocess.run(
                [self._client("psql"), "-X", "-q", "-At", "-d", self.dsn(), "-c", "select 1"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env=self._client_env(),
            )
            out = probe.stdout
            if probe.returncode == 0 and out.strip() == "1":
                return
            time.sleep(0.2)
        raise RuntimeError(f"PostgreSQL on 127.0.0.1:{self.port} did not accept connections within "
                           f"{timeout:.0f}s (last psql output: {out.strip()})" + self._log_tail())

    def stop(self, mode: str = "fast", timeout: float = 60.0) -> None:
        """Stop the server. ``mode="immediate"`` is a crash: no checkpoint, recovery on next start."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"mode must be 'fast', 'immediate' or 'smart', not {mode!r}")
        if not self.is_running():
            return
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self.pgdata), "-m", mode, "-w",
                   "-t", str(int(timeout)), "stop"], timeout=timeout + 30)

    def restart(self, mode: str = "fast") -> "LocalPostgres":
        self.stop(mode)
        return self.start()

    # -- client helpers --------------------------------------------------------------

    def _client(self, name: str) -> str:
        local = self.bindir / name
        if os.access(local, os.X_OK):
            return str(local)
        found = shutil.which(name)
        if found is None:
            raise RuntimeError(f"{name} not found; install postgresql-client.")
        return found

    @staticmethod
    def _client_env() -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["PGCONNECT_TIMEOUT"] = "5"
        return env

    def psql(self, sql: str, dbname: str = "postgres", variables: dict[str, str] | None = None) -> str:
        """Run a SQL script with psql (ON_ERROR_STOP) and return its unaligned output."""
        cmd = [self._client("psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-d", self.dsn(dbname)]
        for key, value in (variables or {}).items():
            cmd += ["-v", f"{key}={value}"]
        result = subprocess.run(cmd, input=sql, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=self._client_env())
        if result.returncode != 0:
            raise RuntimeError(f"psql on {self.dsn(dbname)} failed:\n{result.stdout}")
        return result.stdout

    def create_database(self, name: str) -> str:
        """Create database ``name`` unless it exists; return its SQLAlchemy URL."""
        self.psql(
            "SELECT format('CREATE DATABASE %I', :'name') "
            "WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'name') \\gexec\n",
            variables={"name": name},
        )
        return self.url(name)

    def __enter__(self) -> "LocalPostgres":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _grant_traverse(directory: Path, user: pwd.struct_passwd) -> None:
    """Make sure ``user`` can pass through ``directory`` and each of its parents."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    for d in [directory, *directory.parents]:
        st = d.stat()
        if st.st_uid == user.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if st.st_mode & bit:
            continue
        os.chmod(d, stat.S_IMODE(st.st_mode) | bit)
        who = {stat.S_IXUSR: "u", stat.S_IXGRP: "g", stat.S_IXOTH: "o"}[bit]
        group = grp.getgrgid(st.st_gid).gr_name if bit == stat.S_IXGRP else ""
        warnings.warn(
            f"chmod {who}+x {d}{f' (group {group})' if group else ''}: so that user {user.pw_name!r}, which "
            f"runs PostgreSQL because we are root, can reach its data directory",
            stacklevel=4,
        )


def stop_data_dir(data_dir: str | Path, mode: str = "fast") -> bool:
    """Stop a server started by ``python -m devtools postgres-start``."""
    server = LocalPostgres(data_dir, port=1)  # the port is only used when starting
    if not server.is_running():
        return False
    server.stop(mode)
    return True
