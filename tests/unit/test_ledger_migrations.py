"""The ledger's schema versions on SQLite: migrations match schema.py, versions are checked, newer ledgers refused.

The upgrade of a real earlier ledger (both backends, with a killed upgrade) is tests/integration/test_ledger_upgrade.py.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from airflow_exactly_once.core.errors import LedgerVersionError
from airflow_exactly_once.core.ledger import Ledger, metadata, versioning


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


def test_the_head_of_the_migrations_is_exactly_schema_py(url):
    """Fails when schema.py changes without a migration (or a migration without schema.py)."""
    ledger = Ledger(url)
    ledger.create_schema()
    with ledger.engine.connect() as conn:
        assert versioning.schema_differences(conn) == []
    # The comparison sees a change: a column that only the migrations have.
    with ledger.engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE aeo_batch ADD COLUMN only_in_the_database INTEGER")
    with ledger.engine.connect() as conn:
        assert [d[0] for d in versioning.schema_differences(conn)] == ["remove_column"]


def test_head_names_the_newest_migration_and_a_ledger_at_it_is_used_without_alembic(url):
    """HEAD is bumped with every migration; a task on a current ledger does not import Alembic."""
    import subprocess
    import sys

    assert versioning.HEAD == versioning.head_revision()
    ledger = Ledger(url)
    ledger.create_schema()
    code = ("import sys\n"
            "from airflow_exactly_once.core.ledger import Ledger\n"
            f"ledger = Ledger({url!r})\n"
            "ledger.ensure_pipeline('p', 'fp', {'topics': ['t']})\n"
            "print(ledger.pipeline('p')['pipeline_id'], 'alembic' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["p", "False"]


def test_one_line_of_history_and_a_version_per_engine(url):
    assert versioning.known_revisions()[0] == "0001" and versioning.known_revisions()[-1] == versioning.head_revision()
    ledger = Ledger(url)
    assert ledger.schema_version().state == "empty"
    ledger.create_schema()
    assert ledger.schema_version() == versioning.SchemaVersion(versioning.head_revision(), True,
                                                               versioning.head_revision())
    with ledger.engine.connect() as conn:  # the project's own version table, never Airflow's
        tables = set(sa.inspect(conn).get_table_names())
    assert versioning.VERSION_TABLE in tables and "alembic_version" not in tables
    assert tables - {versioning.VERSION_TABLE} == set(metadata.tables)
    statements = []
    sa.event.listen(ledger.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    ledger.ensure_pipeline("p", "fp", {})
    ledger.ensure_pipeline("p", "fp", {})
    assert not [s for s in statements if versioning.VERSION_TABLE in s or "sqlite_master" in s]


def test_a_ledger_written_before_versioning_is_adopted(url):
    engine = sa.create_engine(url)
    metadata.create_all(engine)  # what the releases before versioning did
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO aeo_pipeline VALUES ('p', 3, 'fp', '{}', '2026-01-01', '2026-01-01')")
    with pytest.raises(LedgerVersionError, match="written before versioning.*airflow-exactly-once db upgrade"):
        Ledger.read_only(url).has_schema()  # a reader never migrates
    from airflow_exactly_once.ui.loading import LedgerReader, LedgerUnavailable

    with pytest.raises(LedgerUnavailable, match="written before versioning.*db upgrade"):
        LedgerReader(url).pipelines()  # the ledger page says so (a 503 page), and changes nothing
    ledger = Ledger(url)
    assert ledger.ensure_pipeline("p", "fp", {}) == 3  # a writer adopts it and keeps its rows
    assert ledger.schema_version().state == "current" and Ledger.read_only(url).has_schema()


def test_automatic_upgrades_can_be_turned_off(url, monkeypatch):
    monkeypatch.setenv(versioning.AUTO_UPGRADE_ENV, "false")
    with pytest.raises(LedgerVersionError, match="automatic upgrades are off.*db upgrade"):
        Ledger(url).ensure_pipeline("p", "fp", {})
    assert Ledger(url).schema_version().state == "empty"  # no DDL happened
    Ledger(url).upgrade_schema()  # what `db upgrade` does
    assert Ledger(url).ensure_pipeline("p", "fp", {}) == 0


def test_a_ledger_newer_than_this_provider_is_refused(url):
    Ledger(url).create_schema()
    with sa.create_engine(url).begin() as conn:
        conn.exec_driver_sql(f"UPDATE {versioning.VERSION_TABLE} SET version_num = '9999'")
    for use in (lambda: Ledger(url).ensure_pipeline("p", "fp", {}), lambda: Ledger.read_only(url).has_schema(),
                lambda: Ledger(url).upgrade_schema()):
        with pytest.raises(LedgerVersionError) as refused:
            use()
        message = str(refused.value)
        assert "revision 9999" in message and f"newest it knows is {versioning.head_revision()}" in message
        assert "Upgrade the provider on every worker" in message and not refused.value.retriable
    assert Ledger(url).schema_version().revision == "9999"  # left untouched


def test_the_cli_upgrades_by_hand_and_reading_commands_never_migrate(url, capsys):
    from airflow_exactly_once.cli.main import main

    engine = sa.create_engine(url)
    metadata.create_all(engine)  # a ledger of the release before versioning
    assert main(["--ledger-url", url, "db", "current"]) == 1
    assert "written before versioning" in capsys.readouterr().out
    assert main(["--ledger-url", url, "pipelines"]) == 2
    assert "db upgrade" in capsys.readouterr().err
    assert Ledger(url).schema_version().state == "unversioned"
    assert main(["--ledger-url", url, "db", "upgrade"]) == 0
    assert f"to {versioning.head_revision()}" in capsys.readouterr().out
    assert main(["--ledger-url", url, "--json", "db", "version"]) == 0
    assert '"state": "current"' in capsys.readouterr().out
    assert main(["--ledger-url", url, "pipelines"]) == 0


def test_reading_commands_on_a_ledger_file_not_made_yet_create_nothing(tmp_path, capsys):
    from airflow_exactly_once.cli.main import main

    path = tmp_path / "not-yet.db"
    url = f"sqlite:///{path}"
    assert main(["--ledger-url", url, "pipelines"]) == 0 and "(none)" in capsys.readouterr().out
    assert main(["--ledger-url", url, "batches", "orders"]) == 2
    assert "no pipeline has run there" in capsys.readouterr().err
    assert not path.exists()


def test_a_ledger_in_airflows_database_leaves_airflows_alembic_version_alone(url):
    """The ledger may share Airflow's metadata database: its version table is its own."""
    with sa.create_engine(url).begin() as conn:
        conn.exec_driver_sql("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)")
        conn.exec_driver_sql("INSERT INTO alembic_version VALUES ('29ce7909c52b')")  # an Airflow revision
    ledger = Ledger(url)
    assert ledger.schema_version().state == "empty"
    ledger.create_schema()
    with ledger.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all() == ["29ce7909c52b"]
        assert versioning.schema_differences(conn) == []  # Airflow's tables are not the ledger's concern
    assert ledger.schema_version().state == "current"


def test_the_migrations_run_from_the_zipped_package_a_spark_submitted_job_imports(tmp_path):
    """spark-submit ships the package as a zip (--py-files): Alembic needs a folder, so the scripts are extracted."""
    import subprocess
    import sys

    from airflow_exactly_once.spark.shipping import build_bundle

    bundle = build_bundle(tmp_path / "bundle")
    script = (f"import sys; sys.path.insert(0, {str(bundle.py_files)!r})\n"
              "from airflow_exactly_once.core.ledger import Ledger, versioning\n"
              "assert '.zip' in versioning.__file__, versioning.__file__\n"
              f"ledger = Ledger({'sqlite:///' + str(tmp_path / 'job.db')!r})\n"
              "ledger.create_schema()\n"
              "print(ledger.schema_version().revision, versioning.head_revision())\n")
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [versioning.head_revision()] * 2
