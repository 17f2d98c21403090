"""The package as Airflow and pip see it: the Airflow floor, optional extras, provider metadata,
the ledger connection type and the `airflow exactly-once` command.

What runs here is the real code on the installed Airflow; a missing extra is simulated by
hiding its module (sys.modules[name] = None), which is exactly what Python reports when the
package is not installed. tests/integration/test_install_matrix.py installs the built wheel
into fresh virtualenvs for the real thing.
"""

from __future__ import annotations

import argparse
import configparser
import importlib
import json
import pkgutil
import sys
import types
from pathlib import Path

import pytest

import airflow_exactly_once
from airflow_exactly_once.airflow_integration import provider_info
from airflow_exactly_once.core.errors import ConfigurationError, MissingExtraError
from airflow_exactly_once.core.ledger import Ledger

PACKAGE = Path(airflow_exactly_once.__file__).resolve().parent


# -- the Airflow floor ---------------------------------------------------------------------


@pytest.mark.parametrize("version", ["3.1.2", "3.1.8", "3.3.2", "3.2.0.dev0", "4.0.0"])
def test_supported_airflow_releases_pass_the_floor(version):
    from airflow_exactly_once.airflow_integration.compat import AIRFLOW_FLOOR, airflow_release, check_airflow_version

    assert airflow_release(version) >= AIRFLOW_FLOOR == (3, 1, 2)
    assert check_airflow_version(version) is None  # raises ImportError below the floor (the test below)


def test_the_import_floor_is_the_one_setup_cfg_requires():
    from devtools.install_matrix import floor_versions

    from airflow_exactly_once.airflow_integration.compat import AIRFLOW_FLOOR

    assert ".".join(map(str, AIRFLOW_FLOOR)) == floor_versions()["apache-airflow"]


@pytest.mark.parametrize("version", ["3.1.1", "3.1.0", "3.0.6", "2.11.0"])
def test_older_airflow_fails_naming_the_release_to_install(version):
    from airflow_exactly_once.airflow_integration.compat import check_airflow_version

    with pytest.raises(ImportError, match=r"needs Apache Airflow >= 3\.1\.2 \(this is Airflow " + version +
                       r"\): upgrade with pip install 'apache-airflow>=3\.1\.2,<4'"):
        check_airflow_version(version)


def test_the_check_runs_when_an_airflow_facing_module_is_imported(monkeypatch):
    import airflow

    monkeypatch.setattr(airflow, "__version__", "3.0.6")
    for name in ("airflow_exactly_once.airflow_integration.compat", "airflow_exactly_once.hooks.ledger"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError, match=r"pip install 'apache-airflow>=3\.1\.2,<4'"):
        importlib.import_module("airflow_exactly_once.hooks.ledger")


# Modules that run only inside one Airflow component and import its own names, which have no SDK home:
# Airflow's CLI definitions, the ledger page in the api-server (plugin base class, auth, DB session), and the
# drift check's reader of Airflow's Asset events (the metadata database's models, from the CLI).
AIRFLOW_COMPONENT_MODULES = {("cli", "definition.py"), ("ui", "plugin.py"), ("ui", "app.py"),
                             ("airflow_integration", "asset_history.py")}


def test_only_compat_imports_airflow_names():
    """One module knows where Airflow keeps its names; the others import them from it."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name in ("compat.py",) or (path.parent.name, path.name) in AIRFLOW_COMPONENT_MODULES:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            if stripped.startswith(("from airflow.", "import airflow.", "from airflow import")) and \
                    "airflow.providers.apache.spark" not in stripped:
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {stripped}")
    assert offenders == []


# -- optional extras ----------------------------------------------------------------------


def _hide(monkeypatch, distribution_module: str, *reimport: str) -> None:
    """Make `distribution_module` unimportable, as if it were not installed, and forget `reimport`."""
    for name in list(sys.modules):
        if name == distribution_module or name.startswith(distribution_module + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, distribution_module, None)
    for name in reimport:
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_without_the_spark_provider_the_package_imports_and_spark_conn_id_names_the_extra(monkeypatch):
    _hide(monkeypatch, "airflow.providers.apache.spark", "airflow_exactly_once.hooks.spark_submit",
          "airflow_exactly_once.operators.write_launch", "airflow_exactly_once.operators.base",
          "airflow_exactly_once.operators.batch",
          "airflow_exactly_once.task_group")
    importlib.import_module("airflow_exactly_once.task_group")
    from airflow_exactly_once.operators.write_launch import _submit_hook_class

    with pytest.raises(MissingExtraError) as raised:
        _submit_hook_class()  # what a write with spark_conn_id asks for before anything else
    assert "pip install 'airflow-exactly-once[spark-submit]'" in str(raised.value)
    assert raised.value.extra == "spark-submit" and not raised.value.retriable
    assert isinstance(raised.value, ConfigurationError)  # the operators fail such a task for good


def test_without_psycopg2_postgres_sink_and_ledger_name_the_extra(monkeypatch):
    modules = [f"airflow_exactly_once.sinks.postgres.{name}" for name in
               ("driver", "errors", "server", "markers", "diagnosis", "commit", "prepare")]
    _hide(monkeypatch, "psycopg2", *modules)
    for module in modules:
        with pytest.raises(MissingExtraError, match=r"\[postgres\] extra"):
            importlib.import_module(module)
    with pytest.raises(MissingExtraError, match=r"pip install 'airflow-exactly-once\[postgres\]'"):
        Ledger("postgresql+psycopg2://u@127.0.0.1:1/db")


def _requirements() -> dict[str, list[str]]:
    """setup.cfg's install_requires ("") and extras, as requirement names."""
    import configparser

    from packaging.requirements import Requirement

    cfg = configparser.ConfigParser()
    cfg.read(PACKAGE.parent / "setup.cfg")

    def names(text: str) -> list[str]:
        return [Requirement(line).name.lower() for line in text.splitlines()
                if line.strip() and not line.strip().startswith("#")]

    groups = {"": names(cfg["options"]["install_requires"])}
    groups.update({extra: names(text) for extra, text in cfg["options.extras_require"].items()})
    return groups


def test_declared_dependencies_cover_every_third_party_import():
    """Each absolute import of the package is the standard library, the package, or a declared requirement."""
    import ast

    imported = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {n for n in imported if n not in sys.stdlib_module_names and n != "airflow_exactly_once"}
    where = {"airflow": "apache-airflow", "kafka": "kafka-python", "confluent_kafka": "confluent-kafka",
             "pyspark": "pyspark", "pyarrow": "pyarrow",
             # the Spark Connect client's gRPC stack: pyspark[connect], the [spark-connect] extra
             "grpc": "pyspark",
             "sqlalchemy": "sqlalchemy", "alembic": "alembic", "psycopg2": "psycopg2-binary", "pyiceberg": "pyiceberg",
             "deltalake": "deltalake",
             # the FAB connection form: only called on Airflow < 3.2 with the FAB UI, which brings them
             "flask_appbuilder": None, "flask_babel": None, "wtforms": None,
             # the ledger page's app in the api-server, the backlog trigger's sync_to_async in the triggerer
             "fastapi": "fastapi", "asgiref": "asgiref",
             # Protobuf in the wire format, the [schema-registry] extra: the runtime (through confluent-kafka[protobuf]
             # and grpcio-tools) and the compiler of the reader's .proto
             "google": "protobuf", "grpc_tools": "grpcio-tools",
             # lineage, the [openlineage] extra: the OpenLineage client (and attrs, its facets' base) come with it
             "openlineage": "apache-airflow-providers-openlineage", "attr": "apache-airflow-providers-openlineage",
             # the Iceberg sink's REST catalog: pyiceberg's transport, bounded by an adapter (the [iceberg] extra)
             "requests": "requests",
             # object storage, the [s3] extra: boto3 and the botocore it brings
             "boto3": "boto3", "botocore": "boto3"}
    assert third_party <= set(where), f"imports without a declared distribution: {sorted(third_party - set(where))}"
    groups = _requirements()
    core = set(groups[""])
    assert {"apache-airflow", "kafka-python", "confluent-kafka", "pyspark", "pyarrow", "pandas", "sqlalchemy",
            "alembic",
            "apache-airflow-providers-common-compat", "fastapi", "asgiref"} <= core  # pandas: pyspark's Arrow paths
    assert "psycopg2-binary" in groups["postgres"]
    assert groups["spark-submit"] == ["apache-airflow-providers-apache-spark"]
    assert groups["spark-connect"] == ["pyspark"]  # pyspark[connect]: the Spark Connect client's gRPC stack
    # pyiceberg[sql-postgres,pyarrow]: the Iceberg sink's committer; requests: its REST client's bounded transport
    assert groups["iceberg"] == ["pyiceberg", "requests"]
    assert groups["openlineage"] == ["apache-airflow-providers-openlineage"]
    assert groups["s3"] == ["boto3"]  # the Parquet sink on object storage (airflow_exactly_once/storage/)
    # pyspark-client installs into pyspark's own folder: nothing of ours may pull it in.
    assert not any("pyspark-client" in names for names in groups.values())


# -- provider metadata --------------------------------------------------------------------


def _airflow_schema(name: str) -> dict:
    import airflow

    return json.loads((Path(airflow.__file__).parent / name).read_text())


def test_provider_info_validates_against_airflows_schema():
    import jsonschema

    info = airflow_exactly_once.get_provider_info()
    jsonschema.validate(info, _airflow_schema("provider_info.schema.json"))
    assert info["package-name"] == "airflow-exactly-once"
    assert info["versions"] == [airflow_exactly_once.__version__]
    assert info["integrations"][0]["integration-name"] == provider_info.INTEGRATION


def test_provider_info_lists_every_hook_and_operator_module_and_each_imports():
    info = airflow_exactly_once.get_provider_info()
    listed = {kind: [m for entry in info[kind] for m in entry["python-modules"]] for kind in ("hooks", "operators")}
    for kind in ("hooks", "operators"):
        present = sorted(f"airflow_exactly_once.{kind}.{m.name}"
                         for m in pkgutil.iter_modules([str(PACKAGE / kind)]))
        assert sorted(listed[kind]) == present
        for module in listed[kind]:
            importlib.import_module(module)  # this stack has every extra installed


def test_connection_type_points_at_a_hook_of_that_type_with_valid_ui_metadata():
    import jsonschema

    conns = airflow_exactly_once.get_provider_info()["connection-types"]
    assert [c["connection-type"] for c in conns] == ["exactly_once_ledger", "schema_registry"]
    for conn, host_label in zip(conns, ("Host or SQLAlchemy URL", "Registry URL")):
        module, _, name = conn["hook-class-name"].rpartition(".")
        hook = getattr(importlib.import_module(module), name)
        assert hook.conn_type == conn["connection-type"]
        behaviour = hook.get_ui_field_behaviour()
        jsonschema.validate(behaviour, _airflow_schema("customized_form_field_behaviours.schema.json"))
        assert behaviour["relabeling"]["host"] == host_label
        assert set(behaviour) == {k.replace("-", "_") for k in conn["ui-field-behaviour"]}


def test_connection_form_widgets_are_the_provider_infos_conn_fields(monkeypatch):
    """Airflow < 3.2 with the FAB UI asks the hook; it must offer the fields 3.2+ reads from the info."""
    made = []

    class StringField:
        def __init__(self, label, widget=None, description=None):
            made.append((label, description))

    modules = {"flask_appbuilder": types.ModuleType("flask_appbuilder"),
               "flask_appbuilder.fieldwidgets": types.SimpleNamespace(BS3TextFieldWidget=object),
               "flask_babel": types.SimpleNamespace(lazy_gettext=lambda text: f"i18n:{text}"),
               "wtforms": types.SimpleNamespace(StringField=StringField)}
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    from airflow_exactly_once.hooks.ledger import LedgerHook

    widgets = LedgerHook.get_connection_form_widgets()
    [conn] = [c for c in airflow_exactly_once.get_provider_info()["connection-types"]
              if c["connection-type"] == "exactly_once_ledger"]
    assert set(widgets) == set(conn["conn-fields"]) == {"backend"}
    assert made == [("i18n:Backend", conn["conn-fields"]["backend"]["description"])]


# -- the exactly_once_ledger connection type ----------------------------------------------


def _conn(**fields):
    from airflow.sdk import Connection

    extra = fields.pop("extra", None)
    return Connection(conn_id="eo_ledger", conn_type="exactly_once_ledger",
                      extra=json.dumps(extra) if extra is not None else None, **fields)


def test_ledger_connection_with_a_full_url_in_host_takes_login_and_password_from_the_fields():
    from sqlalchemy.engine import make_url

    from airflow_exactly_once.airflow_integration.connections import connection_to_url

    url = connection_to_url(_conn(host="postgresql+psycopg2://db.internal:5433/ledger?sslmode=require",
                                  login="eo user", password="p@ss:w/rd"))
    parsed = make_url(url)
    assert (parsed.drivername, parsed.username, parsed.password) == ("postgresql+psycopg2", "eo user", "p@ss:w/rd")
    assert (parsed.host, parsed.port, parsed.database) == ("db.internal", 5433, "ledger")
    assert parsed.query == {"sslmode": "require"}
    # A URL that names its own user is left alone.
    own = "postgresql+psycopg2://owner@db/ledger"
    assert connection_to_url(_conn(host=own, login="other", password="x")) == own


def test_ledger_connection_fields_build_a_postgres_url():
    from sqlalchemy.engine import make_url

    from airflow_exactly_once.airflow_integration.connections import connection_to_url

    url = connection_to_url(_conn(host="db.internal", port=5433, login="eo", password="s3cr@t", schema="ledger",
                                  extra={"sslmode": "require"}))
    parsed = make_url(url)
    assert (parsed.drivername, parsed.username, parsed.password, parsed.host, parsed.port, parsed.database) == (
        "postgresql+psycopg2", "eo", "s3cr@t", "db.internal", 5433, "ledger")
    assert parsed.query == {"sslmode": "require"}


def test_ledger_connection_with_the_sqlite_backend_is_a_usable_ledger(tmp_path):
    from airflow_exactly_once.airflow_integration.connections import connection_to_url

    for extra in ({"backend": "sqlite"}, {"extra__exactly_once_ledger__backend": "sqlite"}):  # new and old UI
        path = tmp_path / f"{len(extra)}-{next(iter(extra))}.db"
        url = connection_to_url(_conn(host=str(path), extra=extra))
        assert url == f"sqlite:///{path}"
        ledger = Ledger(url)
        ledger.create_schema()
        ledger.ensure_pipeline("p", "fp", {})
        assert [p["pipeline_id"] for p in Ledger(url).list_pipelines()] == ["p"]


@pytest.mark.parametrize(("fields", "message"), [
    ({"host": "db", "extra": {"backend": "mysql"}}, "set the extra \"backend\" to \"postgresql\" or \"sqlite\""),
    ({"extra": {"backend": "sqlite"}}, "set Host to the database file"),
    ({"host": "://nowhere"}, "is not a SQLAlchemy URL"),
])
def test_ledger_connection_mistakes_say_what_to_change(fields, message):
    from airflow_exactly_once.airflow_integration.connections import connection_to_url

    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        connection_to_url(_conn(**fields))


def test_ledger_hook_reads_an_exactly_once_ledger_connection_from_airflow(tmp_path, monkeypatch):
    from airflow_exactly_once.hooks.ledger import LedgerHook

    url = f"sqlite:///{tmp_path / 'hook.db'}"
    monkeypatch.setenv("AIRFLOW_CONN_EO_LEDGER_HOOK", json.dumps({"conn_type": "exactly_once_ledger", "host": url}))
    hook = LedgerHook(ledger_conn_id="eo_ledger_hook")
    assert hook.get_url() == url
    hook.get_conn().ensure_pipeline("via-hook", "fp", {})
    assert [p["pipeline_id"] for p in Ledger(url).list_pipelines()] == ["via-hook"]


# -- `airflow exactly-once` ---------------------------------------------------------------


def test_airflow_cli_command_forwards_to_the_ledger_cli(tmp_path, capsys):
    from airflow.cli.cli_config import ActionCommand

    from airflow_exactly_once.cli.definition import get_cli_commands
    from airflow_exactly_once.cli.main import main

    [command] = get_cli_commands()
    assert isinstance(command, ActionCommand) and command.name == "exactly-once"
    assert provider_info.CLI_COMMANDS == ["airflow_exactly_once.cli.definition.get_cli_commands"]
    parser = argparse.ArgumentParser()
    for arg in command.args:
        arg.add_to_parser(parser)
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    Ledger(url).create_schema()
    Ledger(url).ensure_pipeline("orders", "fp", {"topics": ["orders"]})

    command.func(parser.parse_args(["--ledger-url", url, "pipelines", "--json"]))
    assert [row["pipeline"] for row in json.loads(capsys.readouterr().out)] == ["orders"]
    # The same words as the console script, in either position of the options.
    assert main(["pipelines", "--ledger-url", url, "--json"]) == 0
    assert [row["pipeline"] for row in json.loads(capsys.readouterr().out)] == ["orders"]
    with pytest.raises(SystemExit) as failed:  # an error keeps the console script's exit code
        command.func(parser.parse_args(["--ledger-url", url, "show", "nope", "1"]))
    assert failed.value.code == 2
    assert "no pipeline 'nope'" in capsys.readouterr().err


# -- release hygiene ---------------------------------------------------------------------------


def test_the_version_is_written_in_one_place():
    """airflow_exactly_once/version.py; setup.cfg reads it (`attr:`), the package, the provider info and the install
    matrix import it."""
    from setuptools.config.setupcfg import read_configuration

    from devtools.install_matrix import REPO, package_version

    assert read_configuration(REPO / "setup.cfg")["metadata"]["version"] == airflow_exactly_once.__version__
    assert package_version() == airflow_exactly_once.__version__
    assert airflow_exactly_once.get_provider_info()["versions"] == [airflow_exactly_once.__version__]
    written = [line for line in (REPO / "setup.cfg").read_text().splitlines() if line.startswith("version")]
    assert written == ["version = attr: airflow_exactly_once.version.__version__"]
    assert "version" not in (REPO / "pyproject.toml").read_text()


def test_the_package_says_it_is_typed_and_ships_the_marker():
    from devtools.install_matrix import REPO

    assert (PACKAGE / "py.typed").is_file()
    config = configparser.ConfigParser(interpolation=None)
    config.read(REPO / "setup.cfg")
    package_data = config["options.package_data"]["airflow_exactly_once"].split()
    assert "py.typed" in package_data
    assert "py.typed" in (REPO / "MANIFEST.in").read_text()
