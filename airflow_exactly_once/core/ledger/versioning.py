"""The ledger's schema version: Alembic migrations run in code, in the ledger's own version table.

Writers bring the schema to the newest revision on first use (`ensure_current`): an empty database
is created at head, a ledger written before versioning (tables, no version row) is adopted as 0001,
an older one is upgraded; all of it in ONE transaction under the schema lock (PostgreSQL: an
advisory lock; SQLite: the write lock of BEGIN IMMEDIATE), so a crash mid-way leaves the previous
version intact. Readers never migrate (`check_readable`). A ledger newer than this code is refused.
The answer is kept per engine, so only the first use of an engine reads the version.
"""

from __future__ import annotations

import atexit
import importlib.resources
import logging
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from airflow_exactly_once.core.errors import LedgerVersionError
from airflow_exactly_once.core.faults import fault_point
from airflow_exactly_once.core.ledger.engine import read_connection
from airflow_exactly_once.core.ledger.schema import metadata, pipelines

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from alembic.script import ScriptDirectory

log = logging.getLogger(__name__)

# The newest migration's revision, as a constant: a ledger at it is used without importing Alembic (a cost in
# every task process: docs/benchmarks.md) or reading the scripts. Bump it with every migration (tests/unit/test_ledger_migrations.py
# compares it with the scripts' head).
HEAD = "0002"
VERSION_TABLE = "aeo_alembic_version"  # the ledger's own: Airflow's metadata database has `alembic_version`
AUTO_UPGRADE_ENV = "AIRFLOW_EXACTLY_ONCE_LEDGER_AUTO_UPGRADE"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
SCHEMA_LOCK = 0x61656F5F6C656467  # "aeo_ledg": the PostgreSQL advisory lock key of schema changes
UPGRADE_COMMAND = "airflow-exactly-once db upgrade"

_current_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


@dataclass(frozen=True)
class SchemaVersion:
    """Where a ledger's schema stands: `revision` None means no version row (empty, or written before versioning)."""

    revision: str | None
    has_tables: bool
    head: str

    @property
    def state(self) -> str:
        """empty | unversioned | behind | current | ahead."""
        if self.revision is None:
            return "unversioned" if self.has_tables else "empty"
        if self.revision == self.head:
            return "current"
        return "behind" if self.revision in known_revisions() else "ahead"

    def describe(self) -> str:
        return {"empty": "empty (no ledger tables yet)", "unversioned": "written before versioning (no version row)",
                "current": f"at {self.revision}, up to date",
                "behind": f"at {self.revision}, older than {self.head}",
                "ahead": f"at {self.revision}, which this provider does not know (its newest is {self.head})",
                }[self.state]


@lru_cache(maxsize=1)
def script_directory() -> ScriptDirectory:
    """The migration scripts shipped in the package (no alembic.ini: the location is set in code); read once."""
    from alembic.config import Config  # Alembic only for a ledger that is not at HEAD (see HEAD)
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(_migrations_folder()))
    return ScriptDirectory.from_config(config)


def _migrations_folder() -> Path:
    """A folder Alembic can list: the package's own, or, when the package is imported from a zip (a
    spark-submitted write job's --py-files), a copy of the scripts extracted once per process."""
    if MIGRATIONS.is_dir():
        return MIGRATIONS
    target = Path(tempfile.mkdtemp(prefix="aeo-ledger-migrations-"))
    atexit.register(shutil.rmtree, target, True)
    _copy_tree(importlib.resources.files(f"{__package__}.migrations"), target)
    return target


def _copy_tree(source: Traversable, target: Path) -> None:
    for entry in source.iterdir():
        if entry.is_dir():
            if entry.name != "__pycache__":
                (target / entry.name).mkdir()
                _copy_tree(entry, target / entry.name)
        else:
            (target / entry.name).write_bytes(entry.read_bytes())


def head_revision() -> str:
    """The newest revision this provider knows (the history is one line, so there is one head)."""
    heads = script_directory().get_heads()
    if len(heads) != 1:
        raise LedgerVersionError(f"the ledger migrations have {len(heads)} heads ({', '.join(heads)}): "
                                 "every revision must revise the previous one")
    return heads[0]


def known_revisions() -> list[str]:
    """Every revision this provider knows, oldest first."""
    return [s.revision for s in reversed(list(script_directory().walk_revisions()))]


def schema_version(conn: Connection) -> SchemaVersion:
    """Read where the ledger stands (no lock, no writes)."""
    inspector = sa.inspect(conn)
    revision = None
    if inspector.has_table(VERSION_TABLE):
        revision = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
    return SchemaVersion(revision, inspector.has_table(pipelines.name), head_revision())


def auto_upgrade_enabled() -> bool:
    """Writers upgrade the schema on first use unless $AIRFLOW_EXACTLY_ONCE_LEDGER_AUTO_UPGRADE is false."""
    return os.environ.get(AUTO_UPGRADE_ENV, "true").strip().lower() not in ("0", "false", "no", "off")


def upgrade(engine: Engine) -> tuple[SchemaVersion, SchemaVersion]:
    """Bring the ledger to head in one transaction under the schema lock; return (before, after).

    A ledger newer than this code raises LedgerVersionError and is left untouched.
    """
    from alembic.operations import Operations
    from alembic.runtime.migration import MigrationContext

    script = script_directory()
    with engine.begin() as conn:  # on SQLite: BEGIN IMMEDIATE, the write lock for the whole upgrade
        if conn.dialect.name == "postgresql":
            # Writers starting at once on an old or empty ledger would race on the catalog.
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")
        before = schema_version(conn)
        _refuse_newer(before)
        if before.state == "current":
            return before, before
        if before.state == "unversioned":
            log.info("the ledger has no version table: adopting it as revision 0001, then upgrading")
        context = MigrationContext.configure(conn, opts={
            "version_table": VERSION_TABLE, "script": script, "transactional_ddl": True,
            # What `alembic upgrade head` runs (EnvironmentContext's documented use of _upgrade_revs).
            "fn": lambda heads, _context: script._upgrade_revs(before.head, heads),
            "on_version_apply": [_after_step],
        })
        with Operations.context(context):
            context.run_migrations()
        after = schema_version(conn)
    log.info("ledger schema upgraded: %s -> %s", before.revision or before.state, after.revision)
    _current_engines.add(engine)
    return before, after


def ensure_current(engine: Engine, *, auto_upgrade: bool | None = None) -> None:
    """For writers: make sure the schema is at head, upgrading it unless automatic upgrades are off.

    Checked once per engine: planning calls this for every batch.
    """
    if engine in _current_engines or _at_head(engine):
        _current_engines.add(engine)
        return
    with read_connection(engine) as conn:
        version = schema_version(conn)
    _refuse_newer(version)
    if version.state != "current":
        if not (auto_upgrade_enabled() if auto_upgrade is None else auto_upgrade):
            raise LedgerVersionError(f"the ledger is {version.describe()} and automatic upgrades are off "
                                     f"({AUTO_UPGRADE_ENV}=false): run `{UPGRADE_COMMAND}`")
        upgrade(engine)
    _current_engines.add(engine)


def check_readable(engine: Engine) -> bool:
    """For readers (which never migrate): False on an empty database, True at head, otherwise a clear error."""
    if engine in _current_engines or _at_head(engine):
        _current_engines.add(engine)
        return True
    with read_connection(engine) as conn:
        version = schema_version(conn)
    _refuse_newer(version)
    if version.state == "empty":
        return False
    if version.state != "current":
        raise LedgerVersionError(f"the ledger is {version.describe()}; this reader does not change it: "
                                 f"run `{UPGRADE_COMMAND}` (or one batch of a pipeline, which upgrades it)")
    _current_engines.add(engine)
    return True


def _at_head(engine: Engine) -> bool:
    """The common case, in one query: the version row names this code's head (schema_version's catalog lookups
    cost each task two more round trips and most of its first statements' compile time). False when it does not,
    or when there is no version table yet: schema_version tells those apart."""
    try:
        with read_connection(engine) as conn:
            return conn.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").scalar() == HEAD
    except sa.exc.DBAPIError:  # no version table (an empty or unversioned ledger)
        return False


def schema_differences(conn: Connection) -> list:
    """How the database's ledger tables differ from schema.py (Alembic's autogenerate comparison; [] when equal).

    On a database migrated to head this must be empty: a schema change without its migration shows here.
    Tables that are not the ledger's (Airflow's, in a shared database) are left out.
    """
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(conn, opts={
        "version_table": VERSION_TABLE, "compare_type": True,
        "include_name": lambda name, kind, _parent: kind != "table" or name in metadata.tables,
    })
    return compare_metadata(context, metadata)


def _refuse_newer(version: SchemaVersion) -> None:
    if version.state == "ahead":
        raise LedgerVersionError(
            f"the ledger's schema is at revision {version.revision}, which this provider does not know (the newest "
            f"it knows is {version.head}): a newer airflow-exactly-once wrote it. Upgrade the provider on every "
            "worker, scheduler and API server that uses this ledger; older code must not read or write it",
            retriable=False)


def _after_step(**_kw) -> None:
    """After each migration step, before the transaction commits: where the crash tests kill the upgrade."""
    fault_point("ledger.migrate.after_step")
