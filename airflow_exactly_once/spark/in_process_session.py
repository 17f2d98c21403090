"""The SparkSession of an in-process write: local[*] by default, with Kafka's connector and the sink's."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Iterable

from airflow_exactly_once.spark.packages import Package, user_adds_packages, with_connectors

DEFAULT_MASTER = "local[*]"
# pyspark's mark of a process that made a Spark Connect session: once set, every classic getOrCreate()
# asks for a Connect URL instead of starting a driver. Child processes inherit it.
CONNECT_MODE_ENV = "SPARK_CONNECT_MODE_ENABLED"


def build_spark_session(app_name: str, spark_conf: dict[str, Any] | None = None, master: str | None = None,
                        packages: Iterable[Package] = ()):
    """A session that can read Kafka and load the sink's `packages` (see spark.packages for where they come from)."""
    from pyspark.sql import SparkSession

    conf = with_connectors(spark_conf or {}, packages)
    # Python workers must run the interpreter that has this package and the transform.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    drop_stale_connect_mode()
    builder = SparkSession.builder.appName(app_name).master(master or conf.pop("spark.master", DEFAULT_MASTER))
    defaults = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "8",
        "spark.driver.memory": "1g",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
    }
    for key, value in {**defaults, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not user_adds_packages(spark_conf or {}):
        keep_jars_off_python_path(spark, str(conf.get("spark.submit.pyFiles") or "").split(","))
    return spark


def keep_jars_off_python_path(spark, keep: Iterable[str] = ()) -> int:
    """Take the jars Spark resolved for the connectors off the Python workers' path; how many.

    For a Python application Spark adds every jar it resolves from `spark.jars.packages` to the Python
    includes too (for packages that ship Python inside a jar), and every Python task puts them on its
    `sys.path`: the Kafka connector and its dependencies, hadoop-client-runtime among them, slow the start
    of every Python task (a Spark partition of a partition-writer sink; docs/benchmarks.md). Only called when every resolved
    package is one of ours (none carries Python); the jars stay on the JVM's classpath, and the files
    in `keep` (the user's own spark.submit.pyFiles) stay on the Python path.
    """
    context = spark.sparkContext
    includes = getattr(context, "_python_includes", None)  # pyspark's list, sent with every Python task
    if not isinstance(includes, list):
        return 0
    given = {os.path.basename(path) for path in keep}
    kept = [name for name in includes if not name.endswith(".jar") or name in given]
    dropped = len(includes) - len(kept)
    includes[:] = kept
    return dropped


def drop_stale_connect_mode() -> bool:
    """Remove pyspark's Connect mark when no Spark Connect session of this process is open.

    pyspark sets it for good when it creates a remote session and never clears it (except for
    its own local Connect server), so a process that used Spark Connect earlier (a benchmark, a
    test session) and every process it starts later (an Airflow stack's tasks) could no longer
    start the local driver they ask for. True when it was removed.
    """
    if CONNECT_MODE_ENV not in os.environ or _connect_session_open():
        return False
    del os.environ[CONNECT_MODE_ENV]
    return True


def _connect_session_open() -> bool:
    connect = sys.modules.get("pyspark.sql.connect.session")  # never imported: no Connect session
    if connect is None:
        return False
    # The default session is process-wide (the active one is per thread); pyspark resets it on stop().
    session = getattr(connect.SparkSession, "_default_session", None) or connect.SparkSession.getActiveSession()
    return session is not None and not getattr(session, "is_stopped", False)


def stop_spark(spark, timeout_s: float = 30.0) -> None:
    """Stop the session and the driver JVM that pyspark started for it.

    `SparkSession.stop()` leaves pyspark's gateway JVM (and its Python workers) running until
    the Python process exits; a write task stops it at once, so nothing of the task outlives it.
    The JVM exits when its stdin closes (pyspark opens that pipe for this).
    """
    from pyspark import SparkContext

    spark.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if process is not None:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
