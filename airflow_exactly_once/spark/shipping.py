"""What a spark-submit of the write job carries: a launcher script and one zip for `--py-files`.

The zip is built at submit time from the code the Airflow worker runs: this package and,
unless it is an installed distribution, the top-level module or package of the transform.
So the driver and every executor import exactly the code the DAG was tested with, and
a cluster needs no deployment step when the package changes. Third-party libraries that
code on executors imports (kafka-python, psycopg2 for those sinks) are not zipped: they
must be installed on the cluster's Python, like pyspark itself.

Beside each module the zip carries the bytecode this Python already compiled for it (its `__pycache__` file, when
that is current), so that Spark's Python workers, fresh for every Spark Connect session and every submitted job,
load it instead of compiling the package again: Python's zip importer takes `module.pyc` when its source's
timestamp and size match, and falls back to `module.py` when they do not or when the worker runs another Python
(0.55-0.91 s against 0.12-0.44 s to import the 64 modules a Kafka writer needs, load 8; docs/benchmarks.md).
"""

from __future__ import annotations

import importlib.util
import struct
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

from airflow_exactly_once.core.errors import ConfigurationError

PACKAGE = "airflow_exactly_once"
LAUNCHER_NAME = "airflow_exactly_once_write_job.py"
ZIP_NAME = "airflow_exactly_once_job.zip"
CHECKED_HASH = 0b11  # a .pyc header's flags: hash-based, checked against the source (PEP 552)

# spark-submit needs a .py file; the job itself lives in the zipped package.
LAUNCHER = '''"""spark-submit entry point of the airflow-exactly-once write job (generated at submit time)."""
import sys

from airflow_exactly_once.spark.write_job import main

sys.exit(main())
'''


@dataclass(frozen=True)
class JobBundle:
    launcher: Path
    py_files: Path
    modules: tuple[str, ...]  # top-level names in the zip


def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]


def _is_installed(path: Path) -> bool:
    resolved = path.resolve()
    return any(part in ("site-packages", "dist-packages") for part in resolved.parts) or any(
        resolved.is_relative_to(root) for root in _installed_roots())


def transform_source(transform: str | None) -> Path | None:
    """The file or package folder of the transform's top-level module, if it must be shipped."""
    if not transform:
        return None
    top = transform.partition(":")[0].split(".")[0]
    if not top or top == PACKAGE:
        return None
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError) as exc:
        raise ConfigurationError(f"the transform module {top!r} cannot be found ({exc}); put it on the Airflow "
                                 "worker's Python path (e.g. the DAG folder) or install it") from exc
    if spec is None:
        raise ConfigurationError(f"the transform module {top!r} cannot be found; put it on the Airflow worker's "
                                 "Python path (e.g. the DAG folder) or install it")
    if spec.submodule_search_locations:
        source = Path(list(spec.submodule_search_locations)[0])
    elif spec.origin and spec.origin.endswith(".py"):
        source = Path(spec.origin)
    else:
        return None  # built-in or compiled: it has to be installed on the cluster anyway
    return None if _is_installed(source) else source


def current_bytecode(source: Path) -> bytes | None:
    """The `__pycache__` bytecode this Python compiled from `source` (pip compiles it at install), if it is of the
    source as it is now: timestamp-checked with the source's modification time and size, or checked against the
    source's hash (which the zip importer checks again); else None (an unchecked one may be stale)."""
    try:
        cached = Path(importlib.util.cache_from_source(str(source)))
        data = cached.read_bytes()
        stat = source.stat()
    except (OSError, NotImplementedError, ValueError):  # no cache written, or no cache tag for this Python
        return None
    if len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER:
        return None
    flags, mtime, size = struct.unpack("<III", data[4:16])
    if flags == CHECKED_HASH:
        return data
    if flags != 0 or mtime != int(stat.st_mtime) & 0xFFFFFFFF or size != stat.st_size & 0xFFFFFFFF:
        return None  # unchecked, or stale: the worker compiles the source
    return data


def _add_module(archive: zipfile.ZipFile, path: Path, arcname: str) -> None:
    """The module's source, and beside it (`<name>.pyc`) its current bytecode when there is one."""
    archive.write(path, arcname)
    bytecode = current_bytecode(path)
    if bytecode is not None:
        info = zipfile.ZipInfo.from_file(path, arcname + "c")
        info.compress_type = zipfile.ZIP_STORED  # deflating it would cost the write task more than it saves
        archive.writestr(info, bytecode)


def _add_tree(archive: zipfile.ZipFile, source: Path, arcname: str) -> None:
    if source.is_file():
        _add_module(archive, source, arcname)
        return
    for path in sorted(source.rglob("*.py")):
        if "__pycache__" not in path.parts:
            _add_module(archive, path, f"{arcname}/{path.relative_to(source).as_posix()}")


def build_bundle(folder: str | Path, transform: str | None = None) -> JobBundle:
    """Write the launcher and the zip into `folder` (which must outlive the submission)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    launcher = folder / LAUNCHER_NAME
    launcher.write_text(LAUNCHER)
    zipped = folder / ZIP_NAME
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ConfigurationError(f"the {PACKAGE} package has no folder of files to ship to Spark: install it with pip "
                                 "into a folder (not a zip or a namespace package)")
    package_dir = Path(spec.origin).parent
    modules = [PACKAGE]
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_DEFLATED) as archive:
        _add_tree(archive, package_dir, PACKAGE)
        extra = transform_source(transform)
        if extra is not None:
            name = extra.stem if extra.is_file() else extra.name
            _add_tree(archive, extra, extra.name if extra.is_file() else name)
            modules.append(name)
    return JobBundle(launcher, zipped, tuple(modules))
