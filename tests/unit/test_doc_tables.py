"""The docs' hand-written tables of names say what the declarations say, both ways.

Each table is read with devtools.docs.doc_table and compared with the declaration it documents:
every name the table shows is declared, and every declared public name is in the table. Tables
made from a declaration (the arguments, the sinks' options, airflow.cfg's options) are
generated instead, and test_docs.py keeps them fresh.
"""

from __future__ import annotations

import ast
import configparser
import inspect
import re
from typing import Iterable

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from devtools.docs import REPO, cli_commands, code_names, doc_table, tables


def assert_same(documented: Iterable, declared: Iterable, what: str) -> None:
    documented, declared = set(documented), set(declared)
    assert documented == declared, (f"{what}: documented but not declared: {sorted(documented - declared)}; "
                                    f"declared but not documented: {sorted(declared - documented)}")


def first_column(rows: list[list[str]]) -> list[str]:
    return [name for row in rows for name in code_names(row[0])]


def default_row(rows: list[list[str]]) -> str:
    """The name of the row marked "(default)"."""
    marked = [code_names(row[0])[0] for row in rows if "(default)" in row[0]]
    assert len(marked) == 1, f"one row must be marked (default), not {marked}"
    return marked[0]


def shown_default(cell: str) -> object:
    """A default as a table shows it: none, required, or a literal."""
    words = {"none": None, "required": inspect.Parameter.empty}
    return words[cell] if cell in words else ast.literal_eval(cell.strip("`"))


def test_tables_reads_cells_escaped_pipes_and_code():
    text = "intro\n\n| name | what |\n|---|---|\n| `a` (default), `\"b\"` | x \\| y |\n| c | |\n\nafter | not\n"
    assert tables(text) == [[["name", "what"], ['`a` (default), `"b"`', "x | y"], ["c", ""]]]
    assert code_names('`a` (default), `"b"`') == ["a", "b"]


def test_a_missing_table_is_named():
    with pytest.raises(LookupError, match="0 tables whose first column is headed 'no such header'"):
        doc_table("docs/triggers.md", "no such header")


def test_backlog_trigger_arguments():
    from airflow_exactly_once.triggers.backlog import PipelineBacklogTrigger

    parameters = dict(inspect.signature(PipelineBacklogTrigger.__init__).parameters)
    del parameters["self"]
    rows = doc_table("docs/triggers.md", "argument")
    assert_same(first_column(rows), parameters, "PipelineBacklogTrigger's arguments in docs/triggers.md")
    for names, default, _ in rows:  # the default of a row of one argument (rows of several describe theirs)
        if len(code_names(names)) == 1:
            (name,) = code_names(names)
            assert shown_default(default) == parameters[name].default, f"docs/triggers.md: the default of {name}"


def test_cli_commands_and_their_options():
    from airflow_exactly_once.cli.main import parser as cli_parser

    parser = cli_parser()
    # The options every command takes (--ledger-url, --ledger-conn-id, --json) are told above the table.
    common = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    declared = {command: options - common for command, options in cli_commands(parser).items()}
    documented: dict[str, set[str]] = {}
    for usage in first_column(doc_table("docs/operations.md", "command")):
        words = re.match(r"[a-z][a-z ]*?(?= [^a-z]|$)", usage)  # `db current`, not `PIPELINE:SEQ`
        if words:
            documented.setdefault(words.group(0), set()).update(re.findall(r"--[a-z][a-z-]*", usage))
    assert_same(documented, declared, "the CLI's commands in docs/operations.md")
    for command, options in declared.items():
        assert_same(documented[command], options, f"the options of `{command}` in docs/operations.md")


def listed_commands(text: str, after: str) -> list[str]:
    """The command names of the comma-separated list that follows `after` in `text` ("a, b and c" or "a, b, c")."""
    start = text.index(after) + len(after)
    words = re.match(r"[\s(]*([a-z, \n]+)", text[start:]).group(1)
    return [w for w in re.split(r"[,\s]+", words.replace(" and ", ", ")) if w]


def test_the_cli_help_and_the_docs_list_every_command():
    from airflow_exactly_once.cli import main
    from airflow_exactly_once.cli.definition import get_cli_commands

    commands = cli_commands(main.parser())
    top = {command.split()[0] for command in commands}
    (airflow_command,) = get_cli_commands()
    assert_same(listed_commands(airflow_command.description, "console script:"), top,
                "the commands in `airflow exactly-once --help` (cli/definition.py)")
    # `batches PIPELINE [--state ...]` -> batches, `db upgrade` -> db upgrade
    usage = {" ".join(w for w in line.split()[:2] if re.fullmatch(r"[a-z]+", w))
             for line in re.findall(r"^    airflow-exactly-once (.*)$", main.__doc__, re.M)}
    assert_same(usage, commands, "the usage lines of `airflow-exactly-once --help` (cli/main.py's docstring)")
    install = (REPO / "docs" / "install.md").read_text()
    assert_same(listed_commands(install, "The console script `airflow-exactly-once`"), top,
                "the commands docs/install.md lists")


def test_the_readme_performance_table_gives_one_figure_per_row_and_its_command():
    """The history of a figure belongs in docs/benchmarks.md, not in parentheses beside it."""
    rows = doc_table("README.md", "benchmark")
    assert rows
    for what, figure, _, command in rows:
        assert re.fullmatch(r"[\d.]+(?:x| s)(?: the [\w/ ]+)?", figure), f"README: one figure for {what!r}: {figure!r}"
        (line,) = code_names(command)
        script = re.search(r"benchmarks/\w+\.py", line)
        assert script, f"README: the command of {what!r} runs a benchmark script"
        source = (REPO / script.group(0)).read_text()
        unknown = [o for o in re.findall(r"--[a-z][\w-]*", line) if f'"{o}"' not in source]
        assert not unknown, f"README: {script.group(0)} has no option {unknown}"


def setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser(interpolation=None)
    config.read(REPO / "setup.cfg")
    return config


def requirements(lines: str) -> set[str]:
    return {str(Requirement(line)) for line in lines.split("\n") if line}


def test_required_packages_and_their_ranges():
    declared = {Requirement(line).name: Requirement(line).specifier
                for line in setup_cfg()["options"]["install_requires"].split("\n") if line}
    documented = {}
    for names, ranges, _ in doc_table("docs/install.md", "requirement"):
        documented.update(zip(code_names(names), map(SpecifierSet, code_names(ranges)), strict=True))
    assert_same(documented, declared, "install_requires of setup.cfg in docs/install.md")
    assert documented == declared, "docs/install.md shows other ranges than setup.cfg's install_requires"


def test_extras_and_what_they_install():
    # `test` is the repository's own test tooling, not an extra for users.
    declared = {name: requirements(lines) for name, lines in setup_cfg()["options.extras_require"].items()
                if name != "test"}
    rows = doc_table("docs/install.md", "extra")
    assert_same(first_column(rows), declared, "the extras of setup.cfg in docs/install.md")
    for names, installs, _ in rows:
        (extra,) = code_names(names)
        assert_same(requirements("\n".join(code_names(installs))), declared[extra],
                    f"what the [{extra}] extra installs, in docs/install.md")


def test_the_install_matrix_stacks_and_their_extras():
    from devtools.install_matrix import stacks

    floor, newest, line = stacks()
    rows = {row[0]: row for row in doc_table("docs/install.md", "")}
    oldest = rows["oldest allowed"]
    assert (oldest[1], oldest[2]) == (floor.airflow, floor.pyspark), "docs/install.md: the oldest allowed stack"
    assert_same([n for n in code_names(oldest[4]) if n in setup_cfg()["options.extras_require"]], floor.extras,
                "the extras of the install matrix's floor stack in docs/install.md")
    (line_row,) = [row for name, row in rows.items() if "PYSPARK_4_1" in name]
    assert (line_row[1], line_row[2]) == (line.airflow, line.pyspark), "docs/install.md: the pyspark 4.1 stack"
    assert line.iceberg_runtime.split(":")[1] in line_row[4], "docs/install.md: the runtime the 4.1 stack checks"
    (matrix,) = [row for row in doc_table("docs/install.md", "command") if row[0].startswith("`make install-matrix`")]
    assert f"Airflow {floor.airflow} + pyspark {floor.pyspark} with the " in matrix[1]
    assert_same([n for n in code_names(matrix[1]) if n in setup_cfg()["options.extras_require"]],
                floor.extras + line.extras, "the install matrix's extras in docs/install.md's `make install-matrix` row")
    assert f"Airflow {newest.airflow} + pyspark {newest.pyspark}, no extras" in matrix[1] and not newest.extras
    assert f"Airflow {line.airflow} + pyspark {line.pyspark} with the `iceberg` extra" in matrix[1]
    assert line.extras == ("iceberg",)


def test_value_formats():
    from airflow_exactly_once.core.config import VALUE_FORMATS

    assert_same(first_column(doc_table("docs/bad-records.md", "`value_format`")), VALUE_FORMATS,
                "value_format in docs/bad-records.md")


def test_startup_modes_their_default_and_arguments():
    from airflow_exactly_once.core.config import STARTUP_MODES, PipelineConfig
    from airflow_exactly_once.core.declaration import options_of

    options = {o.name: o for o in options_of(PipelineConfig)}
    rows = doc_table("docs/operations.md", "`startup_mode`")
    assert_same(first_column(rows), STARTUP_MODES, "startup_mode in docs/operations.md")
    assert default_row(rows) == options["startup_mode"].default, "docs/operations.md: the default startup_mode"
    arguments = {name for row in rows for name in code_names(row[2]) if re.fullmatch(r"\w+", name)}
    assert arguments and arguments <= set(options), f"not pipeline arguments: {sorted(arguments - set(options))}"


def test_kafka_sink_guarantees_and_their_default():
    from airflow_exactly_once.core.config import GUARANTEES
    from airflow_exactly_once.sinks.kafka.spec import KafkaSpec

    rows = doc_table("docs/sinks/kafka.md", "`guarantee`")
    assert_same(first_column(rows), GUARANTEES, "the Kafka sink's guarantee in docs/sinks/kafka.md")
    (guarantee,) = [o for o in KafkaSpec.options() if o.name == "guarantee"]
    assert default_row(rows) == code_names(guarantee.default_text())[0], "docs/sinks/kafka.md: the default guarantee"


def test_the_kafka_sink_page_names_the_columns_it_writes_with_their_types():
    from airflow_exactly_once.sinks.kafka.sink_writer import HEADERS_TYPE

    page = (REPO / "docs" / "sinks" / "kafka.md").read_text()
    assert "must return a `value` column (STRING or BINARY) and may return `key` (STRING or\nBINARY) and `headers` " \
           f"(`{HEADERS_TYPE}`" in page, "docs/sinks/kafka.md: the columns the Kafka sink writes"


def test_dead_letter_destinations_of_every_sink():
    from airflow_exactly_once.core.errors import ConfigurationError
    from airflow_exactly_once.sinks import SPECS

    rows = doc_table("docs/bad-records.md", "sink")
    sinks = {re.fullmatch(r"\[\w+\]\(sinks/(\w+)\.md\)", row[0]).group(1): row for row in rows}
    assert_same(sinks, SPECS, "the sinks' dead-letter destinations in docs/bad-records.md")
    for kind, (_, default, set_with) in sinks.items():
        assert set(re.findall(r'"type": "(\w+)"', set_with)) <= set(SPECS), f"not a sink type: {set_with}"
        try:
            SPECS[kind].dead_letter_beside({"type": kind, "path": "/out", "table": "orders", "topic": "orders"})
            has_default = True
        except ConfigurationError:
            has_default = False
        assert has_default == (not default.startswith("none")), f"docs/bad-records.md: {kind}'s default destination"


def test_secret_keys_of_the_kafka_settings_and_the_registry():
    from airflow_exactly_once.core.config import REGISTRY_SECRET_KEYS
    from airflow_exactly_once.kafka.setting_names import SECRETS

    rows = {row[0]: row[1] for row in doc_table("docs/secrets.md", "where")}
    (kafka,) = [what for where, what in rows.items() if where.startswith("`kafka_config`")]
    (registry,) = [what for where, what in rows.items() if where.startswith("`schema_registry` connection")]
    assert_same(code_names(kafka), SECRETS, "the Kafka settings' secrets in docs/secrets.md")
    assert_same(code_names(registry), REGISTRY_SECRET_KEYS, "the registry settings' secrets in docs/secrets.md")


def test_schema_registry_connection_fields():
    from airflow_exactly_once.airflow_integration.provider_info import REGISTRY_UI_FIELD_BEHAVIOUR

    form = {"host", "schema", "login", "password", "port", "extra"}  # the fields of Airflow's connection form
    documented = {word.lower() for row in doc_table("docs/schema-registry.md", "field")
                  for word in re.findall(r"\w+", row[0])} & form
    assert_same(documented, form - set(REGISTRY_UI_FIELD_BEHAVIOUR["hidden-fields"]),
                "the schema_registry connection's fields in docs/schema-registry.md")


def kafka_extra(tmp_path) -> dict[str, str]:
    """A `kafka` connection's extra with a value for each key of the docs' translation table."""
    pem = tmp_path / "client.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    return {"bootstrap.servers": "kafka-1:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "u", "sasl.password": "p",
            "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" '
                                'password="p";',
            "ssl.ca.location": str(pem), "ssl.certificate.location": str(pem), "ssl.key.location": str(pem),
            "ssl.key.password": "k", "ssl.crl.location": str(pem), "ssl.endpoint.identification.algorithm": "none",
            "bootstrap.timeout.ms": "5000"}


def setting_names(cell: str) -> dict[str, str | None]:
    """The client settings a cell names (`ssl_cafile`, `ssl.truststore.type=PEM`), with the value it says."""
    found = [name.partition("=") for name in code_names(cell)
             if re.fullmatch(r"[a-z][a-z0-9]*[._][a-z0-9._]*(=.*)?", name)]
    return {key: value if sep else None for key, sep, value in found}


def test_what_each_kafka_client_gets_is_what_the_settings_give_it(tmp_path):
    from kafka import KafkaConsumer

    from airflow_exactly_once.kafka import settings as kafka_settings
    from airflow_exactly_once.kafka.setting_names import KAFKA_PYTHON_NAMES

    extra = kafka_extra(tmp_path)
    settings = kafka_settings.KafkaSettings.from_mapping(extra)
    clients = {"kafka-python": settings.kafka_python(KafkaConsumer), "Java": settings.java(),
               "librdkafka": settings.librdkafka()}
    rows = doc_table("docs/connections.md", "connection extra")
    keys = [key for row in rows for key in setting_names(row[0])]
    assert set(keys) <= set(extra), f"give {sorted(set(keys) - set(extra))} a value in kafka_extra()"
    # Each setting kafka.setting_names renames for kafka-python has its row.
    assert set(KAFKA_PYTHON_NAMES) <= set(keys), "docs/connections.md: a renamed setting has no row"
    for row in rows:
        for client, cell in zip(clients, row[1:], strict=True):
            for name, value in setting_names(cell).items():
                assert name in clients[client], f"docs/connections.md: {row[0]} does not give {client} {name}"
                if value is not None:
                    assert str(clients[client][name]) == value, f"docs/connections.md: {client}'s {name}"


def test_the_kafka_connection_keys_are_the_translated_ones(tmp_path):
    from kafka import KafkaConsumer

    from airflow_exactly_once.kafka.settings import SASL_MECHANISMS, SECURITY_PROTOCOLS, KafkaSettings

    rows = doc_table("docs/connections.md", "key")
    keys = set(first_column(rows))
    translated = {key for row in doc_table("docs/connections.md", "connection extra") for key in setting_names(row[0])}
    assert translated <= keys, f"docs/connections.md: keys missing from the table of keys: {translated - keys}"
    # A key that needs no translation reaches kafka-python under its own name (dots as underscores).
    given = {**{key: "1" for key in keys}, **kafka_extra(tmp_path)}
    kafka_python = KafkaSettings.from_mapping(given).kafka_python(KafkaConsumer)
    unknown = {key for key in keys - translated if key.replace(".", "_") not in kafka_python}
    assert not unknown, f"docs/connections.md: keys kafka.settings neither translates nor hands on: {sorted(unknown)}"
    values = {code_names(row[0])[0]: [v for v in code_names(row[1]) if re.fullmatch(r"[A-Z0-9_-]+", v)]
              for row in rows if row[0].startswith(("`security.protocol`", "`sasl.mechanism`"))}
    assert_same(values["security.protocol"], SECURITY_PROTOCOLS, "security.protocol in docs/connections.md")
    assert_same(values["sasl.mechanism"], SASL_MECHANISMS, "sasl.mechanism in docs/connections.md")
