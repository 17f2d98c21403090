"""Which Iceberg Spark runtime the Iceberg sink needs, as coordinates the framework completes.

Iceberg publishes one runtime per Spark release line and Scala version; the sink names the
template and spark.packages fills in the installed pyspark's (`{spark_line}`, `{scala}`).
"""

from __future__ import annotations

# The Iceberg release whose Spark runtime Spark resolves when the user's settings name none
# (Maven Central has iceberg-spark-runtime-3.5_2.12 and -4.0_2.13 in it); a user who needs another
# one names it in spark.jars.packages, which wins.
ICEBERG_RELEASE = "1.10.1"
ICEBERG_SPARK_RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-{spark_line}_{scala}:" + ICEBERG_RELEASE


def readable(coordinates: str) -> str:
    """Coordinates for an error message: the placeholders as words."""
    return coordinates.replace("{spark_line}", "<spark release line>").replace("{scala}", "<scala version>")
