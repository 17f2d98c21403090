"""JVM libraries built once per Spark release line, and published for some lines only (Iceberg's Spark runtime).

Such a library cannot follow the installed Spark the way Spark's own connectors do: a newer Spark
line may have no build yet, and asking Spark to resolve one that does not exist ends in an
unreadable failure of Spark's start ("Java gateway process exited"). So a sink declares the lines
that have one, and the Spark line is checked against them before any Spark starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_exactly_once.core.errors import ConfigurationError

__all__ = ["LinePackage", "LineRelease"]


def default_scala(spark_version: str) -> str:
    """The Scala binary version of Apache's Spark builds of a release: 2.12 before Spark 4, 2.13 since (for a Spark
    whose jars cannot be looked at, such as a Spark Connect server's)."""
    return "2.12" if int(spark_version.split(".")[0]) < 4 else "2.13"


@dataclass(frozen=True)
class LineRelease:
    """The release of a library that has a build for `spark_line` ("4.0"), with the Scala binary versions built."""

    spark_line: str
    release: str
    scala: tuple[str, ...]


@dataclass(frozen=True)
class LinePackage:
    """Maven coordinates per Spark line: `template` with `{spark_line}`, `{scala}` and `{release}`, and the lines
    that have a build (`releases`)."""

    what: str  # for messages: "Iceberg's Spark runtime"
    template: str  # "org.apache.iceberg:iceberg-spark-runtime-{spark_line}_{scala}:{release}"
    releases: tuple[LineRelease, ...]

    @property
    def artifact(self) -> str:
        """What names any line's build in a user's jar settings: "iceberg-spark-runtime"."""
        return self.template.split(":")[1].split("{", 1)[0].rstrip("-_")

    def release_for(self, spark_line: str) -> LineRelease | None:
        return next((r for r in self.releases if r.spark_line == spark_line), None)

    def available(self) -> str:
        """The lines that have a build, as messages say it: "Spark 3.5 (Scala 2.12 or 2.13) and 4.0 (Scala 2.13) in
        release 1.11.0"."""
        by_release: dict[str, list[str]] = {}
        for r in self.releases:
            by_release.setdefault(r.release, []).append(f"{r.spark_line} (Scala {' or '.join(r.scala)})")
        return "; ".join(f"Spark {', '.join(lines[:-1])}{' and ' if len(lines) > 1 else ''}{lines[-1]} in release "
                         f"{release}" for release, lines in by_release.items())

    def coordinates(self, spark_version: str, scala: str, where: str = "the installed pyspark") -> str:
        """The coordinates for Spark `spark_version` ("4.0.0" or "4.0") built with Scala `scala`; a
        ConfigurationError naming the lines that have a build and the fixes when there is none.

        `where` says whose Spark it is: the installed pyspark, or a Spark Connect server's Spark.
        """
        line = ".".join(spark_version.split(".")[:2])
        found = self.release_for(line)
        if found is not None and scala in found.scala:
            return self.template.format(spark_line=line, scala=scala, release=found.release)
        built = f"Spark {line} with Scala {scala}" if found is not None else f"Spark {line}"
        raise ConfigurationError(
            f"{self.what} ({self.artifact}) has no build for {built} ({where}: {spark_version}); it "
            f"is published for {self.available()}. Run the write on Spark of one of those lines (e.g. pip install a "
            f"pyspark of it), or, with a build of your own for Spark {line}, name it in spark_conf's "
            f"spark.jars.packages (or its jar in spark.jars): your own {self.artifact} always wins")

