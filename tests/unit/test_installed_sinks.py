"""Sinks of other distributions: found through the entry point group by the same registry as the built-in ones.

Each test puts real distribution metadata (a `.dist-info` folder with its entry points, and the module it names)
on sys.path, as pip installs it; importlib.metadata reads it as it reads any installed distribution.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from airflow_exactly_once.core.errors import ConfigurationError
from airflow_exactly_once.sinks import (INSTALLED, SPECS, check_sink_spec_at_parse, spec_secret_paths, spec_type,
                                        sink_types)
from airflow_exactly_once.sinks.installed import ENTRY_POINT_GROUP

SPEC_MODULE = '''
from dataclasses import dataclass
from airflow_exactly_once.core.declaration import SinkSpec, argument


@dataclass(kw_only=True)
class LinesSpec(SinkSpec):
    type_name = "{type_name}"
    writer_class = "{module}:Nowhere"
    committer_class = "{module}:Nowhere"

    path: str = argument(doc="The output folder")
    fsync: bool = argument(True, "Flush before publishing")
    token: str | None = argument(None, "The service's token", secret=True)
'''


class SitePackages:
    """A folder on sys.path that distributions are 'installed' into (metadata and modules)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: list[str] = []

    def install(self, distribution: str, sinks: dict[str, str], modules: dict[str, str]) -> None:
        info = self.root / f"{distribution.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
        lines = "".join(f"{name} = {value}\n" for name, value in sinks.items())
        (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{lines}")
        for module, text in modules.items():
            (self.root / f"{module}.py").write_text(textwrap.dedent(text))
            self.modules.append(module)

    def install_spec(self, distribution: str, type_name: str, module: str) -> None:
        self.install(distribution, {type_name: f"{module}:LinesSpec"},
                     {module: SPEC_MODULE.format(type_name=type_name, module=module)})


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    INSTALLED.forget()
    packages = SitePackages(tmp_path)
    yield packages
    INSTALLED.forget()
    for module in packages.modules:
        sys.modules.pop(module, None)


def test_the_registry_finds_an_installed_distributions_sink(site):
    site.install_spec("lines-sink", "lines", "lines_spec")
    declaration = spec_type({"type": "lines", "path": "/data/out"})
    assert declaration.__module__ == "lines_spec" and declaration.type_name == "lines"
    assert sink_types() == [*SPECS, "lines"]
    assert "lines" not in SPECS  # the package's own list (and the docs made from it) stays its own


def test_parse_time_checks_know_an_installed_sinks_keys_and_values(site):
    site.install_spec("lines-sink", "lines", "lines_spec")
    check_sink_spec_at_parse({"type": "lines", "path": "/data/out", "fsync": "{{ params.fsync }}"})
    with pytest.raises(ConfigurationError, match=r"the lines sink has no setting 'pth' \(did you mean 'path'\?\)"):
        check_sink_spec_at_parse({"type": "lines", "pth": "/data/out"})
    with pytest.raises(ConfigurationError, match=r"the lines sink's fsync must be True or False, not 'yes'"):
        check_sink_spec_at_parse({"type": "lines", "path": "/data/out", "fsync": "yes"})
    assert spec_secret_paths({"type": "lines", "path": "/data/out", "token": "s3cr3t"}) == [["token"]]


def test_a_sink_type_declared_twice_names_both_distributions(site):
    site.install_spec("lines-sink", "lines", "lines_spec")
    site.install_spec("other-lines", "lines", "other_lines_spec")
    with pytest.raises(ConfigurationError, match=r"'lines' is declared more than once: by (lines-sink|other-lines) "
                                                 r"\(lines = \w+:LinesSpec\) and by (lines-sink|other-lines)") as caught:
        spec_type({"type": "lines", "path": "/data/out"})
    assert "lines-sink" in str(caught.value) and "other-lines" in str(caught.value)
    assert "pip uninstall" in str(caught.value) and not caught.value.retriable


def test_a_distribution_declaring_a_built_in_type_is_refused_by_name(site):
    site.install_spec("my-parquet", "parquet", "my_parquet_spec")
    with pytest.raises(ConfigurationError, match=r"'parquet' is declared more than once: by airflow-exactly-once "
                                                 r"\(built in\) and by my-parquet \(parquet = my_parquet_spec:"):
        check_sink_spec_at_parse({"type": "parquet", "path": "/data/out"})
    assert "my_parquet_spec" not in sys.modules  # refused by its metadata, never imported


def test_a_sink_that_fails_to_load_names_its_distribution_and_breaks_nothing_else(site):
    site.install("broken-sink", {"broken": "broken_spec:BrokenSpec"},
                 {"broken_spec": "import a_client_library_that_is_not_installed\n"})
    check_sink_spec_at_parse({"type": "parquet", "path": "/data/out"})  # pipelines of other sinks still parse
    assert spec_type({"type": "kafka", "topic": "out"}) is SPECS["kafka"]
    assert "broken" in sink_types() and "broken_spec" not in sys.modules  # listed, not imported
    with pytest.raises(ConfigurationError) as caught:
        check_sink_spec_at_parse({"type": "broken", "path": "/data/out"})
    message = str(caught.value)
    assert "the 'broken' sink of the distribution broken-sink" in message
    assert "broken = broken_spec:BrokenSpec" in message and "a_client_library_that_is_not_installed" in message
    assert "pip uninstall broken-sink" in message and not caught.value.retriable


def test_an_entry_point_must_name_a_spec_of_its_own_type(site):
    site.install("odd-sinks", {"notaspec": "odd_specs:NotASpec", "misnamed": "lines_spec:LinesSpec"},
                 {"odd_specs": "class NotASpec:\n    pass\n",
                  "lines_spec": SPEC_MODULE.format(type_name="lines", module="lines_spec")})
    with pytest.raises(ConfigurationError, match="which is not a sink spec: the entry point must name a subclass of "
                                                 "airflow_exactly_once.core.declaration.SinkSpec"):
        spec_type({"type": "notaspec"})
    with pytest.raises(ConfigurationError, match="whose type_name is 'lines': make the entry point's name and the "
                                                 "spec's type_name the same"):
        spec_type({"type": "misnamed"})


def test_the_group_is_read_once(site):
    assert "lines" not in sink_types()
    site.install_spec("lines-sink", "lines", "lines_spec")
    with pytest.raises(ConfigurationError, match="unknown sink type 'lines'"):
        spec_type({"type": "lines", "path": "/data/out"})  # installed after the registry read the group
    INSTALLED.forget()
    assert spec_type({"type": "lines", "path": "/data/out"}).type_name == "lines"
