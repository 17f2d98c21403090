"""Spark's connectors (its Kafka source, a sink's runtime such as Iceberg's), found the way Spark users find them.

pyspark ships none of them. Every pipeline needs Spark's Kafka connector
(`spark-sql-kafka-0-10`); a sink may need more (`SinkWriter.spark_packages()`: Iceberg's Spark
runtime and its catalog's JDBC driver). For each one: if the user's Spark settings already
name it, in `spark_conf`, in `PYSPARK_SUBMIT_ARGS` or in `spark-defaults.conf`, nothing is
added. Otherwise Spark resolves it from Maven Central by itself (`spark.jars.packages`), with
coordinates that follow the installed pyspark and its Scala version. Nothing here runs Maven.

The installed pyspark is the Spark line these coordinates follow, in the task and for
spark-submit alike (a Spark Connect server is started with its own packages). A library built
for some lines only (core.line_packages: Iceberg's runtime) is refused here for a line without
a build, before any Spark starts; `check_line_packages` asks the same when a DAG is parsed or a
batch planned. Reading the installed release and Scala version imports no pyspark.

Spark's resolver (Ivy) looks into `~/.m2/repository` first, and a pom there without its jar
(Maven leaves such entries for managed dependencies) fails the whole resolution. So when
the coordinates are ours, Spark also gets an Ivy settings file that leaves `~/.m2` out,
unless the user configured Ivy (`spark.jars.ivySettings`) already.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shlex
from pathlib import Path
from typing import Any, Iterable, Mapping, Union

from airflow_exactly_once.core.config import PipelineConfig
from airflow_exactly_once.core.line_packages import LinePackage, default_scala
from airflow_exactly_once.kafka.settings import KafkaSettings
from airflow_exactly_once.sinks import pipeline_writer
from airflow_exactly_once.sinks.iceberg.runtime import ICEBERG_SPARK_RUNTIME

__all__ = ["with_connectors"]

CONNECTOR = "spark-sql-kafka-0-10"
GROUP = "org.apache.spark"
IVY_SETTINGS = Path(__file__).with_name("ivysettings.xml")
# Kafka's Java client parses OAuth tokens with jose4j, which kafka-clients' POM does not make Spark's Kafka
# connector bring (0.9.6: Kafka 4.x's; Kafka 3.9's 0.9.4 API is the same).
JOSE4J_PACKAGE = "org.bitbucket.b_c:jose4j:0.9.6"
_JAR_KEYS = ("spark.jars", "spark.jars.packages")
# What a sink names as a package: Maven coordinates (a template with `{spark_line}` and `{scala}`), or a library
# built for some Spark lines only.
Package = Union[str, LinePackage]


def spark_home() -> Path:
    """The Spark distribution inside the pyspark wheel (jars/, bin/), found without importing pyspark."""
    found = importlib.util.find_spec("pyspark")
    if found is None or not found.submodule_search_locations:
        raise RuntimeError("pyspark is not installed here: pip install airflow-exactly-once installs it")
    return Path(list(found.submodule_search_locations)[0]).resolve()


def spark_version() -> str:
    """The installed pyspark's release, e.g. "4.0.0" (a ".dev0" or "+local" tail removed), read from its metadata
    (a plan task or a DAG parse imports no pyspark)."""
    try:
        text = importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:  # a pyspark on the path but not installed (a source tree)
        import pyspark

        text = pyspark.__version__
    match = re.match(r"\d+\.\d+\.\d+", text)
    if match is None:
        raise RuntimeError(f"cannot read a Spark release from the installed pyspark's version {text!r}")
    return match.group(0)


def scala_version(home: Path | None = None, version: str | None = None) -> str:
    """Scala binary version of the installed Spark: from its scala-library jar, else by release line."""
    jars = (home or spark_home()) / "jars"
    for jar in jars.glob("scala-library-*.jar"):
        match = re.match(r"scala-library-(\d+\.\d+)\.", jar.name)
        if match:
            return match.group(1)
    return default_scala(version or spark_version())


def kafka_package(version: str | None = None, scala: str | None = None) -> str:
    """Maven coordinates of the connector matching the installed pyspark."""
    version = version or spark_version()
    return f"{GROUP}:{CONNECTOR}_{scala or scala_version(version=version)}:{version}"


def artifact_of(coordinates: str) -> str:
    """What names a package in the user's jar settings: its artifact id without the Scala suffix.

    "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0" -> "spark-sql-kafka-0-10", found in both
    `--packages` coordinates and jar file names ("spark-sql-kafka-0-10_2.13-4.0.0.jar").
    """
    parts = coordinates.split(":")
    if len(parts) < 3 or not all(parts[:3]):
        raise ValueError(f"not Maven coordinates 'group:artifact:version': {coordinates!r}")
    return re.sub(r"_\d+\.\d+$", "", parts[1])


def _defaults_file() -> Path | None:
    folder = os.environ.get("SPARK_CONF_DIR")
    if folder:
        return Path(folder) / "spark-defaults.conf"
    home = os.environ.get("SPARK_HOME")
    return Path(home) / "conf" / "spark-defaults.conf" if home else None


def _read_defaults(path: Path | None) -> dict[str, str]:
    """spark-defaults.conf as Spark reads it: one "key value" (or "key=value") per line."""
    if path is None or not path.is_file():
        return {}
    settings = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = re.split(r"\s+|=", line, maxsplit=1)
        settings[parts[0]] = parts[1].strip() if len(parts) > 1 else ""
    return settings


def _submit_args(environ: Mapping[str, str], flags: tuple[str, ...], keys: tuple[str, ...]) -> list[str]:
    """The values PYSPARK_SUBMIT_ARGS gives `flags` (`--jars a.jar`) and `keys` (`--conf key=value`)."""
    args = shlex.split(environ.get("PYSPARK_SUBMIT_ARGS", "") or "")
    values = []
    for flag, value in zip(args, args[1:]):
        if flag in flags:
            values.append(value)
        elif flag == "--conf" and value.split("=", 1)[0] in keys:
            values.append(value.split("=", 1)[-1])
    return values


def names_package(artifact: str, conf: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> bool:
    """Whether Spark will already load `artifact` (see artifact_of) from the user's own settings."""
    environ = os.environ if environ is None else environ
    if any(artifact in str(conf.get(key) or "") for key in _JAR_KEYS):
        return True
    if any(artifact in value for value in _submit_args(environ, ("--jars", "--packages"), _JAR_KEYS)):
        return True
    defaults = _read_defaults(_defaults_file())
    return any(artifact in defaults.get(key, "") for key in _JAR_KEYS)


def user_adds_packages(conf: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user's own settings ask Spark to resolve packages (`spark.jars.packages`, `--packages`) or
    name Python files of their own on the command line (`--py-files`)."""
    environ = os.environ if environ is None else environ
    in_args = _submit_args(environ, ("--packages", "--py-files"), ("spark.jars.packages", "spark.submit.pyFiles"))
    return (bool(str(conf.get("spark.jars.packages") or "").strip()) or any(v.strip() for v in in_args)
            or bool(_read_defaults(_defaults_file()).get("spark.jars.packages", "").strip()))


def package_artifact(package: Package) -> str:
    """What names `package` in the user's settings: a library per Spark line by any line's build (the user's own
    build for a line without one wins too), Maven coordinates by their artifact."""
    if isinstance(package, LinePackage):
        return package.artifact
    return artifact_of(for_installed_spark(package))


def with_connectors(conf: Mapping[str, Any], packages: Iterable[Package] = ()) -> dict[str, Any]:
    """`conf` plus what Spark needs to load the Kafka connector and `packages` (Maven coordinates, templates
    such as a sink's completed here: the one place packages reach Spark's settings).

    Each package the user's settings do not name already goes to `spark.jars.packages`, for
    Spark's own resolution; one built for some Spark lines only is a ConfigurationError when the
    installed pyspark's line has no build (before Spark starts).
    """
    result = dict(conf)
    named = [p for p in dict.fromkeys([kafka_package(), *packages]) if not names_package(package_artifact(p), result)]
    missing = list(dict.fromkeys(map(for_installed_spark, named)))
    if not missing:
        return result
    given = [p for p in str(result.get("spark.jars.packages") or "").split(",") if p.strip()]
    result["spark.jars.packages"] = ",".join([*given, *missing])
    result.setdefault("spark.jars.ivySettings", str(IVY_SETTINGS))
    return result


def check_line_packages(conf: Mapping[str, Any], packages: Iterable[Package]) -> None:
    """Before a write is launched (a DAG parsed, a batch planned): what `with_connectors` would refuse, a library
    the user's settings do not name that has no build for the installed pyspark's line."""
    for package in packages:
        if isinstance(package, LinePackage) and not names_package(package.artifact, conf):
            for_installed_spark(package)


def for_installed_spark(coordinates: Package, version: str | None = None, scala: str | None = None) -> str:
    """Maven coordinates with `{spark_line}` ("4.0") and `{scala}` ("2.13") of the installed pyspark filled in.

    A sink names its Spark packages as such templates (SinkWriter.spark_packages()), so it needs no
    knowledge of the Spark it runs on; coordinates without placeholders pass through. A library per
    Spark line gives its build for the line, or a ConfigurationError naming the lines that have one.
    """
    where = "the installed pyspark" if version is None else "the write's Spark"
    version = version or spark_version()
    scala = scala or scala_version(version=version)
    if isinstance(coordinates, LinePackage):
        return coordinates.coordinates(version, scala, where)
    return coordinates.format(spark_line=".".join(version.split(".")[:2]), scala=scala)


def iceberg_package(version: str | None = None, scala: str | None = None) -> str:
    """Maven coordinates of Iceberg's Spark runtime for the installed pyspark's release line and Scala (a
    ConfigurationError for a line Iceberg has no runtime for)."""
    return for_installed_spark(ICEBERG_SPARK_RUNTIME, version, scala)


def avro_package(version: str | None = None, scala: str | None = None) -> str:
    """Maven coordinates of Spark's Avro functions (`from_avro`), which pyspark does not ship either."""
    version = version or spark_version()
    return f"{GROUP}:spark-avro_{scala or scala_version(version=version)}:{version}"


def pipeline_packages(config: PipelineConfig) -> list[Package]:
    """What a pipeline's write loads besides Kafka's connector: its sink writer's packages, spark-avro when
    the Kafka values or keys are Avro (value_format / key_format "avro"), and jose4j when the pipeline logs in
    to Kafka with OAuth tokens."""
    avro = "avro" in (config.value_format, config.key_format)
    oauth = KafkaSettings.of(config).uses_oauth
    return [*pipeline_writer(config).spark_packages(), *([avro_package()] if avro else []),
            *([JOSE4J_PACKAGE] if oauth else [])]
