"""Fetch JVM artifacts from Maven Central with the machine's own `mvn`.

Kafka's broker and Spark's Kafka connector are published there; fetching them with
Maven keeps the project free of download URLs and lets Maven's cache do its work.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

from airflow_exactly_once.core.errors import ConfigurationError

KAFKA_VERSION = "3.9.1"  # the default broker of tests and the demo
# Another broker release, e.g. 4.4.0 (`make test-kafka4` runs the Kafka tests against it).
KAFKA_VERSION_ENV = "AIRFLOW_EXACTLY_ONCE_KAFKA_VERSION"
SCALA_BINARY = "2.13"  # of the Kafka broker


@dataclass(frozen=True)
class Artifact:
    group: str
    name: str
    version: str
    transitive: bool = True
    exclude_groups: tuple[str, ...] = ()  # transitive dependencies of these groups are left out
    classifier: str = ""  # e.g. "jar-with-dependencies": a self-contained build published beside the plain jar


# The broker's SLF4J binding by major release: Kafka 3.x logs with reload4j; Kafka 4.x brings
# log4j2 (log4j-api, log4j-core) but no binding for its slf4j-api 1.7, so log4j-slf4j-impl is
# named, in the log4j2 release Kafka 4.4 depends on.
_KAFKA_LOGGING = {
    3: Artifact("org.slf4j", "slf4j-reload4j", "1.7.36"),
    4: Artifact("org.apache.logging.log4j", "log4j-slf4j-impl", "2.25.5", False),
}


def kafka_version() -> str:
    """The broker release tests and the demo run: $AIRFLOW_EXACTLY_ONCE_KAFKA_VERSION, else KAFKA_VERSION.

    Kafka 3.9 speaks the classic transaction protocol; 4.x turns on transactions v2 (KIP-890),
    which the Kafka sink's transaction adapter checks it is not drawn into (EndTxn below v5).
    """
    return os.environ.get(KAFKA_VERSION_ENV, "").strip() or KAFKA_VERSION


def kafka_major(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        raise RuntimeError(f"{KAFKA_VERSION_ENV}={version!r} is not a Kafka release such as 3.9.1 or 4.4.0") from None


def kafka_broker_artifacts(version: str) -> tuple[Artifact, ...]:
    major = kafka_major(version)
    if major not in _KAFKA_LOGGING:
        raise RuntimeError(f"Kafka {version}: devtools runs brokers of releases "
                           f"{', '.join(f'{m}.x' for m in sorted(_KAFKA_LOGGING))}; set {KAFKA_VERSION_ENV} to one")
    return (Artifact("org.apache.kafka", f"kafka_{SCALA_BINARY}", version), _KAFKA_LOGGING[major])



def spark_kafka_artifacts(version: str, scala: str) -> tuple[Artifact, ...]:
    """Spark's Kafka source for Spark `version` built with Scala `scala`, with its runtime dependencies.

    Which kafka-clients and commons-pool2 a Spark release wants is in its POMs, so Maven resolves
    them; Hadoop's client jars (large, and in every pyspark already) are not even downloaded.
    """
    return (Artifact("org.apache.spark", f"spark-sql-kafka-0-10_{scala}", version,
                     exclude_groups=("org.apache.hadoop",)),)


# PostgreSQL's JDBC driver: the benchmark's baseline (Spark's own JDBC writer) and the Iceberg sink's JDBC catalog.
POSTGRES_JDBC = (Artifact("org.postgresql", "postgresql", "42.7.4", False),)


def artifact(coordinates: str, transitive: bool = False) -> Artifact:
    """An Artifact from Maven coordinates "group:artifact:version"."""
    group, name, version = coordinates.split(":")[:3]
    return Artifact(group, name, version, transitive)


def iceberg_jars() -> list[str]:
    """Iceberg's Spark runtime for the installed pyspark (one shaded jar), the JDBC drivers of its catalogs, and
    the AWS SDK bundle of its S3FileIO (a warehouse on object storage)."""
    from airflow_exactly_once.sinks.iceberg.catalog import POSTGRES_JDBC_PACKAGE, SQLITE_JDBC_PACKAGE
    from airflow_exactly_once.sinks.iceberg.file_io import AWS_BUNDLE_PACKAGE
    from airflow_exactly_once.spark.packages import iceberg_package

    runtime = artifact(iceberg_package())
    jars = []
    for kind, coordinates in ((runtime.name, iceberg_package()), ("sqlite-jdbc", SQLITE_JDBC_PACKAGE),
                              ("postgres-jdbc", POSTGRES_JDBC_PACKAGE), ("iceberg-aws-bundle", AWS_BUNDLE_PACKAGE)):
        folder = fetch_jars(kind, (artifact(coordinates),), strip_version=True)
        jars.extend(sorted(str(p) for p in folder.glob("*.jar")))
    return jars


# "0" for a stack whose Spark release has no spark-avro on the package index (the newest stack:
# spark-avro 4.2.0 is not on Maven Central here); its test subset has no Avro test.
SPARK_AVRO_ENV = "AIRFLOW_EXACTLY_ONCE_SPARK_AVRO"


def avro_jars() -> list[str]:
    """Spark's Avro functions (spark-avro) for the installed pyspark: Avro itself ships with pyspark."""
    from airflow_exactly_once.spark.packages import avro_package

    if os.environ.get(SPARK_AVRO_ENV, "1") == "0":
        return []

    coordinates = avro_package()
    folder = fetch_jars(artifact(coordinates).name, (artifact(coordinates),), strip_version=True)
    return sorted(str(p) for p in folder.glob("*.jar"))


def spark_connector_jars() -> list[str]:
    """What a test's Spark loads: Kafka's connector, spark-avro and jose4j (Kafka's OAuth logins) (Iceberg's jars:
    spark_conf_dir)."""
    return spark_kafka_jars() + avro_jars() + jose4j_jars()


def jose4j_jars() -> list[str]:
    """jose4j, which Kafka's Java client needs for OAUTHBEARER logins (spark.packages.JOSE4J_PACKAGE)."""
    from airflow_exactly_once.spark.packages import JOSE4J_PACKAGE

    folder = fetch_jars(artifact(JOSE4J_PACKAGE).name, (artifact(JOSE4J_PACKAGE),), strip_version=True)
    return sorted(str(jar) for jar in folder.glob("*.jar"))


def devenv_home() -> Path:
    """Where downloaded jars and local service data live (outside the package)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "airflow-exactly-once"
    return Path(os.environ.get("AIRFLOW_EXACTLY_ONCE_HOME", default))


def _pom(artifacts: tuple[Artifact, ...]) -> str:
    deps = []
    for a in artifacts:
        groups = ("*",) if not a.transitive else a.exclude_groups
        exclusions = "".join(f"<exclusion><groupId>{g}</groupId><artifactId>*</artifactId></exclusion>"
                             for g in groups)
        exclusions = f"<exclusions>{exclusions}</exclusions>" if exclusions else ""
        classifier = f"<classifier>{a.classifier}</classifier>" if a.classifier else ""
        deps.append(
            f"<dependency><groupId>{a.group}</groupId><artifactId>{a.name}</artifactId>"
            f"<version>{a.version}</version>{classifier}{exclusions}</dependency>"
        )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>airflow-exactly-once</groupId><artifactId>devenv</artifactId><version>1</version>"
        f"<packaging>pom</packaging><dependencies>{''.join(deps)}</dependencies></project>"
    )


def built_once(target: Path, lock_name: str, build: Callable[[Path], Path]) -> Path:
    """`target`, made by `build` once per machine: `build(work)` runs Maven in the temporary folder `work` and
    returns the folder to keep.

    The cache is shared by every run on the machine (demo, tests, benchmarks, in parallel): one Maven runs
    at a time (the lock file `lock_name`; Maven's own repository takes no locks), and the folder appears
    only complete, by a rename, so a reader never sees it half made and a finished folder is never replaced.
    """
    if (target / ".complete").exists():
        return target
    if shutil.which("mvn") is None:
        raise RuntimeError("Maven (`mvn`) is not installed; run `make setup` or `apt-get install maven`.")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / lock_name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():  # made by another process while we waited
            return target
        shutil.rmtree(target, ignore_errors=True)  # left incomplete by a process that died
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as work:
            staging = build(Path(work))
            (staging / ".complete").touch()
            os.rename(staging, target)
    return target


def fetch_jars(kind: str, artifacts: tuple[Artifact, ...], strip_version: bool = False) -> Path:
    """Copy `artifacts` (and their runtime dependencies) into a cached folder (`built_once`); return it.

    strip_version: name the files `<artifactId>.jar`, so callers can tell artifacts apart.
    """
    def copy_dependencies(work: Path) -> Path:
        pom = work / "pom.xml"
        pom.write_text(_pom(artifacts))
        staging = work / "jars"
        result = subprocess.run(
            ["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
             f"-DoutputDirectory={staging}", "-DincludeScope=runtime", f"-Dmdep.stripVersion={strip_version}"],
            capture_output=True, text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"Maven could not fetch the {kind} jars:\n{result.stdout[-3000:]}"
                               f"{result.stderr[-2000:]}")
        return staging

    return built_once(devenv_home() / "jars" / f"{kind}-{artifacts[0].version}", ".fetch.lock", copy_dependencies)


def kafka_broker_jars(version: str | None = None) -> Path:
    return fetch_jars("kafka-broker", kafka_broker_artifacts(version or kafka_version()))


def installed_spark() -> tuple[str, str]:
    """(release, Scala binary version) of the pyspark installed here: the connector must match both."""
    from airflow_exactly_once.spark.packages import scala_version, spark_version

    version = spark_version()
    return version, scala_version(version=version)


def spark_kafka_jars() -> list[str]:
    """Local paths of the spark-sql-kafka connector jars for the installed pyspark, for `spark.jars`.

    Only the jars that pyspark lacks: a second, other release of a library pyspark ships (lz4,
    snappy, slf4j, Scala) on the same classpath is a conflict, not a dependency.
    """
    from airflow_exactly_once.spark.packages import spark_home

    version, scala = installed_spark()
    folder = fetch_jars(f"spark-kafka_{scala}", spark_kafka_artifacts(version, scala), strip_version=True)
    bundled = [jar.name for jar in (spark_home() / "jars").glob("*.jar")]
    return sorted(str(jar) for jar in folder.glob("*.jar") if not _bundled(jar.stem, bundled))


def _bundled(artifact_id: str, bundled_jars: list[str]) -> bool:
    """Whether pyspark's jars/ has some release of `artifact_id` (files named <artifactId>-<version>.jar)."""
    pattern = re.compile(rf"{re.escape(artifact_id)}-\d[^/]*\.jar")
    return any(pattern.fullmatch(name) for name in bundled_jars)


def postgres_jdbc_jars() -> list[str]:
    """Local paths of PostgreSQL's JDBC driver, for `spark.jars`."""
    folder = fetch_jars("postgres-jdbc", POSTGRES_JDBC)
    return sorted(str(p) for p in folder.glob("*.jar"))


def spark_conf_dir(folder: str | Path) -> Path:
    """A SPARK_CONF_DIR whose spark-defaults.conf loads the pre-fetched Kafka connector, spark-avro and Iceberg jars.

    Tests, the demo and the benchmarks pass the connector this way, explicitly, as a Spark user
    would: Spark reads the file in every driver it starts (in-process, spark-submit), so no
    write task resolves packages at run time.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        iceberg = iceberg_jars()
    except (RuntimeError, ConfigurationError) as exc:  # a pyspark release line Iceberg has no runtime for yet
        print(f"devtools: no Iceberg jars for this pyspark ({str(exc)[:200]}); Iceberg tables cannot be written")
        iceberg = []
    (folder / "spark-defaults.conf").write_text(f"spark.jars {','.join(spark_connector_jars() + iceberg)}\n")
    return folder


def use_prefetched_connector() -> Path:
    """Point this process (and what it starts) at a SPARK_CONF_DIR with the pre-fetched connector jars."""
    if not os.environ.get("SPARK_CONF_DIR"):
        os.environ["SPARK_CONF_DIR"] = str(spark_conf_dir(tempfile.mkdtemp(prefix="aeo-spark-conf-")))
    return Path(os.environ["SPARK_CONF_DIR"])


def delta_jars() -> list[str]:
    """Delta Lake's Spark library for the installed pyspark (the Delta sink's tests read tables with Spark's Delta
    reader), without the jars pyspark ships: the release per Spark line is the package's own table."""
    from airflow_exactly_once.sinks.delta.runtime import delta_spark_package
    from airflow_exactly_once.spark.packages import spark_home, spark_version

    coordinates = delta_spark_package(spark_version())
    folder = fetch_jars(artifact(coordinates).name, (artifact(coordinates, transitive=True),), strip_version=True)
    bundled = [jar.name for jar in (spark_home() / "jars").glob("*.jar")]
    return sorted(str(jar) for jar in folder.glob("*.jar") if not _bundled(jar.stem, bundled))
