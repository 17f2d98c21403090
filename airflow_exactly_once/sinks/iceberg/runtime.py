"""Which Iceberg Spark runtime the Iceberg sink needs on each Spark release line: one table.

Iceberg publishes one runtime per Spark line and Scala version, and not for every line in every
release (Maven Central: 1.10.1 has 3.5 and 4.0, 1.11.0 has 3.5, 4.0 and 4.1, 1.12.0 has 3.5 and
4.1; none has 4.2). One release serves every line that has it: 1.11.0 is the only one with all
three, so every stack writes with the same Iceberg (one combination with pyiceberg to keep right,
not one per line). spark.packages completes the coordinates for the write's Spark, and refuses a
line that is not here before any Spark starts.
"""

from __future__ import annotations

from airflow_exactly_once.core.line_packages import LinePackage, LineRelease

# The Iceberg release whose Spark runtime Spark resolves when the user's settings name none; a user who needs
# another one names it in spark.jars.packages, which wins.
ICEBERG_RELEASE = "1.11.0"
# [START iceberg_runtimes]
ICEBERG_SPARK_RUNTIME = LinePackage(
    what="Iceberg's Spark runtime",
    template="org.apache.iceberg:iceberg-spark-runtime-{spark_line}_{scala}:{release}",
    releases=(
        LineRelease("3.5", ICEBERG_RELEASE, ("2.12", "2.13")),
        LineRelease("4.0", ICEBERG_RELEASE, ("2.13",)),
        LineRelease("4.1", ICEBERG_RELEASE, ("2.13",)),
    ),
)
# [END iceberg_runtimes]

