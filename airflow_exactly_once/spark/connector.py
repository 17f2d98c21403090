"""Spark's Kafka connector (`spark-sql-kafka-0-10`), found the way Spark users find it.

pyspark does not ship the connector. If the user's Spark settings already name it, in
`spark_conf`, in `PYSPARK_SUBMIT_ARGS` or in `spark-defaults.conf`, nothing is added.
Otherwise Spark resolves it from Maven Central by itself (`spark.jars.packages`), with the
coordinates of the installed pyspark and its Scala version. Nothing here runs Maven.

Spark's resolver (Ivy) looks into `~/.m2/repository` first, and a pom there without its jar
(Maven leaves such entries for managed dependencies) fails the whole resolution. So when
the coordinates are ours, Spark also gets an Ivy settings file that leaves `~/.m2` out,
unless the user configured Ivy (`spark.jars.ivySettings`) already.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any, Mapping

CONNECTOR = "spark-sql-kafka-0-10"
GROUP = "org.apache.spark"
IVY_SETTINGS = Path(__file__).with_name("ivysettings.xml")
_JAR_KEYS = ("spark.jars", "spark.jars.packages")


def spark_home() -> Path:
    """The Spark distribution inside the pyspark wheel (jars/, bin/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_version() -> str:
    """The installed pyspark's release, e.g. "4.0.0" (a ".dev0" or "+local" tail removed)."""
    import pyspark

    match = re.match(r"\d+\.\d+\.\d+", pyspark.__version__)
    if match is None:
        raise RuntimeError(f"cannot read a Spark release from pyspark.__version__={pyspark.__version__!r}")
    return match.group(0)


def scala_version(home: Path | None = None, version: str | None = None) -> str:
    """Scala binary version of the installed Spark: from its scala-library jar, else by release line."""
    jars = (home or spark_home()) / "jars"
    for jar in jars.glob("scala-library-*.jar"):
        match = re.match(r"scala-library-(\d+\.\d+)\.", jar.name)
        if match:
            return match.group(1)
    return "2.12" if int((version or spark_version()).split(".")[0]) < 4 else "2.13"


def kafka_package(version: str | None = None, scala: str | None = None) -> str:
    """Maven coordinates of the connector matching the installed pyspark."""
    version = version or spark_version()
    return f"{GROUP}:{CONNECTOR}_{scala or scala_version(version=version)}:{version}"


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


def _submit_args_name_connector(text: str) -> bool:
    args = shlex.split(text or "")
    for flag, value in zip(args, args[1:]):
        if flag in ("--jars", "--packages") and CONNECTOR in value:
            return True
        if flag == "--conf" and value.split("=", 1)[0] in _JAR_KEYS and CONNECTOR in value:
            return True
    return False


def names_kafka_connector(conf: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> bool:
    """Whether Spark will already load the connector from the user's own settings."""
    environ = os.environ if environ is None else environ
    if any(CONNECTOR in str(conf.get(key) or "") for key in _JAR_KEYS):
        return True
    if _submit_args_name_connector(environ.get("PYSPARK_SUBMIT_ARGS", "")):
        return True
    defaults = _read_defaults(_defaults_file())
    return any(CONNECTOR in defaults.get(key, "") for key in _JAR_KEYS)


def with_kafka_connector(conf: Mapping[str, Any]) -> dict[str, Any]:
    """`conf` plus what Spark needs to load the connector, if the user's settings do not name it."""
    result = dict(conf)
    if names_kafka_connector(result):
        return result
    packages = [p for p in str(result.get("spark.jars.packages") or "").split(",") if p.strip()]
    result["spark.jars.packages"] = ",".join([*packages, kafka_package()])
    result.setdefault("spark.jars.ivySettings", str(IVY_SETTINGS))
    return result
