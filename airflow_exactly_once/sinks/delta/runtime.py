"""Which Delta Lake release a Spark that reads the sink's tables needs, per pyspark release line.

The sink's own write needs none: Spark stages plain Parquet and delta-rs creates and commits the
table. Spark's Delta reader (other jobs, the tests) needs Delta's jars built for its Spark line and
the session extension and catalog set when the session starts (static settings: Delta refuses
even a read without them), which `reader_conf` gives in the form of spark.packages' templates.
"""

from __future__ import annotations

from airflow_exactly_once.core.errors import ConfigurationError

# The Delta release built for each Spark line (Maven Central: io.delta:delta-spark_<scala>:<release>). For 4.2,
# delta-spark 4.4.1 asks Spark for io.delta:delta-spark_4.2_2.13:4.4.1, which is not on Maven Central; 4.4.0 is.
DELTA_RELEASES = {"3.5": ("3.3.2", "2.12"), "4.0": ("4.0.1", "2.13"), "4.2": ("4.4.0", "2.13")}
EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


def delta_spark_package(spark_version: str) -> str:
    """Maven coordinates of Delta's Spark library for a pyspark release ("4.0.0"); ConfigurationError naming the line
    when no release built for it is known."""
    line = ".".join(spark_version.split(".")[:2])
    if line not in DELTA_RELEASES:
        raise ConfigurationError(
            f"no Delta Lake release is known here for Spark {line} (pyspark {spark_version}); these are: "
            f"{', '.join(f'Spark {k}: delta-spark {v[0]}' for k, v in DELTA_RELEASES.items())}. Name the Delta "
            "release built for your Spark in spark.jars.packages (io.delta:delta-spark_<scala>:<release>)")
    release, scala = DELTA_RELEASES[line]
    return f"io.delta:delta-spark_{scala}:{release}"


def reader_conf(spark_version: str) -> dict[str, str]:
    """The session settings with which Spark reads (and time-travels) Delta tables: the package, the extension and
    the catalog."""
    return {"spark.jars.packages": delta_spark_package(spark_version), "spark.sql.extensions": EXTENSION,
            "spark.sql.catalog.spark_catalog": CATALOG}
