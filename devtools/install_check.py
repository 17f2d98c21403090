"""What must hold wherever the package is installed; run by that environment's own Python.

devtools/install_matrix.py runs this file (as a script, from outside the repository, so that
`airflow_exactly_once` is the installed wheel, never the source tree) in each fresh virtualenv;
tests/integration/test_provider.py runs it in the test environment. It imports nothing of the
repository and writes one JSON report (--report; Airflow may log to stdout); the exit status
is 1 when a check failed.

Checks:
  modules    every module of the package imports; a module whose extra is not installed fails
             with MissingExtraError naming that extra, and with nothing else
  warnings   no DeprecationWarning, PendingDeprecationWarning or FutureWarning (Airflow's
             deprecated-import warnings are FutureWarnings) raised from the package or the DAGs,
             on import or while the DAGs parse
  dags       every DAG file of --dags parses (Airflow's DagBag, the DAG folder importable as under
             the dag-processor) with no import error, and the --expect-dags are there; but on a pyspark
             line Iceberg publishes no Spark runtime for, a DAG with an Iceberg sink must be refused
             with the error naming the line (reported under "refused"), and is not expected
  provider   `airflow providers list` shows the package, `airflow providers hooks` the ledger
             connection type, neither logs an error about the package
  cli        the console script answers; on Airflow >= 3.2 `airflow exactly-once` too
  connector  the Kafka connector coordinates follow the installed pyspark (release and Scala)
  spark      (--spark) a local Spark session gets the connector by Spark's own resolution, reads
             the Kafka source's schema, builds a small batch's local relation with the same types,
             and runs mapInArrow (pandas and pyarrow on that pyspark)
  iceberg    (--expect-iceberg-runtime COORDINATES) the Iceberg sink picks exactly that Spark runtime for
             the installed pyspark; with --spark the same session also loads it (Spark's own resolution
             from Maven Central) and appends to an Iceberg table and reads it back
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dags", required=True, help="the folder of DAG files to parse")
    parser.add_argument("--expect-dags", default="", help="comma-separated DAG ids that must be there")
    parser.add_argument("--extras", default="", help="comma-separated extras installed here")
    parser.add_argument("--spark", action="store_true", help="also start a local Spark session")
    parser.add_argument("--expect-iceberg-runtime", default="",
                        help="the Maven coordinates of the Iceberg Spark runtime the sink must pick here")
    parser.add_argument("--report", required=True, help="where to write the JSON report")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="aeo-install-check-") as home:
        return _check(args, home)


def _check(args: argparse.Namespace, home: str) -> int:
    """Run every check; `home` holds Airflow's home (unless one is set) and the CLI's ledger."""
    os.environ.setdefault("AIRFLOW_HOME", home)
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

    report: dict[str, Any] = {"python": sys.executable, "problems": []}
    problems: list[str] = report["problems"]
    import airflow  # noqa: F401  (configures Airflow's logging, which takes over warnings.showwarning)

    import airflow_exactly_once as package

    ours = [str(Path(package.__file__).resolve().parent), str(Path(args.dags).resolve())]
    report["package"] = str(Path(package.__file__).resolve().parent)
    report["versions"] = _versions()
    extras = {e for e in args.extras.split(",") if e}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report["modules"] = check_modules(package, extras, problems)
        report["dags"] = check_dags(Path(args.dags), [d for d in args.expect_dags.split(",") if d], problems)
    report["deprecations_from_us"] = [
        f"{w.category.__name__} at {w.filename}:{w.lineno}: {w.message}" for w in caught
        if issubclass(w.category, DEPRECATIONS) and any(str(Path(w.filename).resolve()).startswith(o) for o in ours)]
    problems.extend(f"deprecation: {w}" for w in report["deprecations_from_us"])
    report["provider"] = check_provider(problems)
    report["cli"] = check_cli(home, problems)
    report["connector"] = check_connector(problems)
    report["extras"] = check_extras(extras, problems)
    if args.expect_iceberg_runtime:
        report["iceberg_runtime"] = check_iceberg_runtime(args.expect_iceberg_runtime, problems)
    if args.spark:
        report["spark"] = check_spark(problems, iceberg_runtime=args.expect_iceberg_runtime or None)
    Path(args.report).write_text(json.dumps(report, indent=1, default=str))
    return 1 if problems else 0


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("airflow-exactly-once", "apache-airflow", "apache-airflow-core", "apache-airflow-task-sdk",
                 "pyspark", "pyspark-client", "pandas", "pyarrow", "kafka-python", "sqlalchemy",
                 "apache-airflow-providers-common-compat", "apache-airflow-providers-apache-spark",
                 "apache-airflow-providers-postgres", "psycopg2-binary"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def check_modules(package: Any, extras: set[str], problems: list[str]) -> dict[str, str]:
    from airflow_exactly_once.core.errors import MissingExtraError

    results = {}
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        name = info.name
        if ".example_dags" in name or name.endswith(".__main__"):
            continue  # DAG files are parsed below; __main__ runs the CLI
        try:
            importlib.import_module(name)
            results[name] = "ok"
        except MissingExtraError as exc:
            results[name] = f"needs [{exc.extra}]"
            if exc.extra in extras:
                problems.append(f"{name}: the [{exc.extra}] extra is installed, yet: {exc}")
        except Exception as exc:  # noqa: BLE001 - every failure is a finding
            results[name] = f"{type(exc).__name__}: {exc}"
            problems.append(f"{name} does not import: {type(exc).__name__}: {exc}")
    return results


def check_extras(extras: set[str], problems: list[str]) -> dict[str, str]:
    """What an installed extra must make work beyond importing: [schema-registry] compiles a .proto (protoc from the
    grpcio-tools wheel) and reads its message; [openlineage] gives a step's lineage with the batch facet."""
    results = {}
    if "schema-registry" in extras:
        try:
            from airflow_exactly_once.records.protobuf_schema import compile_proto, reader_message

            message = reader_message(compile_proto('syntax = "proto3"; package shop; message Order { int64 id = 1; }',
                                                   {}, "the install check's schema"), "the install check")
            results["schema-registry"] = f"compiled a .proto, read its message {message.name}"
        except Exception as exc:  # noqa: BLE001 - every failure is a finding
            problems.append(f"[schema-registry]: a .proto does not compile: {type(exc).__name__}: {exc}")
    if "openlineage" in extras:
        try:
            from airflow_exactly_once.airflow_integration.lineage import FACET_NAME, step_lineage
            from airflow_exactly_once.core.config import PipelineConfig
            from airflow_exactly_once.sinks import pipeline_committer
            from airflow_exactly_once.sinks.dead_letters import lineage_outputs

            config = PipelineConfig(pipeline_id="p", topics=["t"], bootstrap_servers="k:9092",
                                    sink={"type": "parquet", "path": "/data/p"})
            found = step_lineage(config, lineage_outputs(pipeline_committer(config).bind(config)), None)
            assert found is not None and FACET_NAME in found.run_facets, found
            results["openlineage"] = f"{len(found.inputs)} input, {len(found.outputs)} output, {FACET_NAME}"
        except Exception as exc:  # noqa: BLE001
            problems.append(f"[openlineage]: no lineage: {type(exc).__name__}: {exc}")
    return results


def check_dags(folder: Path, expected: list[str], problems: list[str]) -> dict[str, Any]:
    try:
        from airflow.dag_processing.dagbag import DagBag  # Airflow >= 3.2
    except ImportError:
        from airflow.models.dagbag import DagBag
    sys.path.insert(0, str(folder))  # as the dag-processor does: the DAG folder is importable
    kwargs = {"include_examples": False} if "include_examples" in inspect.signature(DagBag).parameters else {}
    bag = DagBag(dag_folder=str(folder), **kwargs)
    dags = {dag_id: sorted(dag.task_ids) for dag_id, dag in bag.dags.items()}
    no_runtime = iceberg_runtime_missing()
    refused = {f: e.strip().splitlines()[-1] for f, e in bag.import_errors.items()
               if no_runtime and no_runtime in e.strip().splitlines()[-1]}
    errors = {f: e for f, e in bag.import_errors.items() if f not in refused}
    problems.extend(f"DAG import error in {f}: {e.strip().splitlines()[-1]}" for f, e in errors.items())
    not_parsed = {m for f in refused for m in re.findall(r'dag_id="([^"]+)"', Path(f).read_text())}
    missing = sorted(set(expected) - set(dags) - not_parsed)
    if missing:
        problems.append(f"DAGs not found in {folder}: {missing}")
    return {"folder": str(folder), "dags": dags, "import_errors": {f: e[-500:] for f, e in errors.items()},
            "refused": refused}


def iceberg_runtime_missing() -> str | None:
    """The start of the error a DAG with an Iceberg sink is refused with on this pyspark's line, if Iceberg publishes
    no Spark runtime for it; None when it does."""
    from airflow_exactly_once.core.errors import ConfigurationError
    from airflow_exactly_once.spark.packages import iceberg_package, spark_version

    try:
        iceberg_package()
    except ConfigurationError:
        return f"has no build for Spark {'.'.join(spark_version().split('.')[:2])} (the installed pyspark"
    return None


def _airflow(*args: str) -> subprocess.CompletedProcess:
    airflow = str(Path(sys.executable).with_name("airflow"))
    return subprocess.run([airflow, *args], capture_output=True, text=True, timeout=600)


def check_provider(problems: list[str]) -> dict[str, Any]:
    from airflow_exactly_once import __version__

    listed = _airflow("providers", "list", "-o", "json")
    hooks = _airflow("providers", "hooks", "-o", "json")
    result: dict[str, Any] = {}
    try:
        providers = {p["package_name"]: p["version"] for p in json.loads(listed.stdout[listed.stdout.index("["):])}
    except ValueError:
        problems.append(f"`airflow providers list` printed no JSON (exit {listed.returncode}): {listed.stderr[-1500:]}")
        return result
    result["listed_version"] = providers.get("airflow-exactly-once")
    if result["listed_version"] != __version__:
        problems.append(f"`airflow providers list` shows airflow-exactly-once as {result['listed_version']!r}")
    result["ledger_connection_type"] = '"exactly_once_ledger"' in hooks.stdout
    if not result["ledger_connection_type"]:
        problems.append(f"`airflow providers hooks` lacks exactly_once_ledger: {hooks.stderr[-1500:]}")
    # The ledger page: Airflow finds the plugin through the `airflow.plugins` entry point of the installed package.
    plugins = _airflow("plugins", "-o", "json")
    try:
        found = {p["name"]: p for p in json.loads(plugins.stdout[plugins.stdout.index("["):])}
    except ValueError:
        found = {}
    page = found.get("exactly_once", {})
    result["ledger_page"] = [a["url_prefix"] for a in page.get("fastapi_apps", [])] + \
        [v["href"] for v in page.get("external_views", [])]
    if result["ledger_page"] != ["/exactly-once", "/exactly-once/ui"]:
        problems.append(f"`airflow plugins` does not show the ledger page plugin exactly_once: {plugins.stdout[-800:]}"
                        f"{plugins.stderr[-1500:]}")
    complaints = [line for out in (listed.stderr, hooks.stderr, plugins.stderr) for line in out.splitlines()
                  if "airflow_exactly_once" in line and re.search(r"(?i)error|exception|warning|traceback", line)]
    result["complaints"] = complaints
    problems.extend(f"Airflow complains about the provider: {line}" for line in complaints)
    return result


def check_cli(home: str, problems: list[str]) -> dict[str, Any]:
    from airflow_exactly_once.airflow_integration.compat import airflow_release
    import airflow

    url = f"sqlite:///{Path(home) / 'cli-ledger.db'}"
    script = Path(sys.executable).with_name("airflow-exactly-once")
    if not script.exists():
        problems.append(f"the console script {script} is not installed")
        return {}
    # The ledger's migrations run from the installed wheel (they are package files, not repository ones).
    upgrade = subprocess.run([str(script), "--ledger-url", url, "db", "upgrade"], capture_output=True, text=True,
                             timeout=300)
    result: dict[str, Any] = {"db upgrade": upgrade.returncode == 0 and "upgraded the ledger" in upgrade.stdout}
    if not result["db upgrade"]:
        problems.append(f"db upgrade failed (exit {upgrade.returncode}): {upgrade.stdout[-500:]} "
                        f"{upgrade.stderr[-1500:]}")
    runs = {"console script": subprocess.run([str(script), "--ledger-url", url, "pipelines", "--json"],
                                             capture_output=True, text=True, timeout=300)}
    if airflow_release(airflow.__version__) >= (3, 2, 0):  # provider CLI commands arrived in Airflow 3.2
        runs["airflow exactly-once"] = _airflow("exactly-once", "--ledger-url", url, "pipelines", "--json")
    for name, run in runs.items():
        result[name] = run.returncode == 0 and run.stdout.strip().endswith("[]")
        if not result[name]:
            problems.append(f"{name} failed (exit {run.returncode}): {run.stdout[-500:]} {run.stderr[-1500:]}")
    return result


def check_connector(problems: list[str]) -> str:
    import pyspark

    from airflow_exactly_once.spark.packages import kafka_package

    release = re.match(r"\d+\.\d+\.\d+", pyspark.__version__).group(0)
    scala = "2.12" if release.startswith("3.") else "2.13"  # what each pyspark wheel ships
    coordinates = kafka_package()
    if coordinates != f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{release}":
        problems.append(f"connector coordinates {coordinates} do not match pyspark {pyspark.__version__}")
    return coordinates


def check_iceberg_runtime(expected: str, problems: list[str]) -> str:
    """The Iceberg Spark runtime the sink resolves for the installed pyspark (spark.packages.iceberg_package)."""
    from airflow_exactly_once.core.errors import ConfigurationError
    from airflow_exactly_once.spark.packages import iceberg_package

    try:
        picked = iceberg_package()
    except ConfigurationError as exc:
        picked = f"refused: {exc}"
    if picked != expected:
        problems.append(f"the Iceberg sink picks {picked} for this pyspark, not {expected}")
    return picked


def check_spark(problems: list[str], iceberg_runtime: str | None = None) -> dict[str, Any]:
    """A local session with the connector from Spark's own resolution (no SPARK_CONF_DIR, no spark.jars); with
    `iceberg_runtime`, that package too, and an append to a table of Iceberg's Hadoop catalog read back."""
    from airflow_exactly_once.spark.in_process_session import build_spark_session
    from airflow_exactly_once.spark.records import KAFKA_COLUMNS
    from airflow_exactly_once.spark.batch_read import local_frame

    os.environ.pop("SPARK_CONF_DIR", None)
    os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
    started = time.monotonic()
    spark = build_spark_session("install-check", master="local[1]", packages=[iceberg_runtime] if iceberg_runtime
                                else ())
    iceberg_rows = None
    try:
        if iceberg_runtime:
            iceberg_rows = _iceberg_append(spark)
        source = (spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
                  .option("subscribe", "install-check").load())
        columns = source.columns
        # A small batch is read by the write itself and handed to Spark as a local relation: same columns, types.
        local = local_frame(spark, [(b"k", b"v", "install-check", 2, 7, 1_700_000_000_123, 0)])
        local_types = [(f.name, f.dataType.simpleString()) for f in local.schema.fields]
        source_types = [(f.name, f.dataType.simpleString()) for f in source.schema.fields]
        local_row = local.selectExpr("partition", "offset", "unix_millis(timestamp) AS ms").collect()[0]
        frame = spark.range(1000).selectExpr("id", "CAST(id AS STRING) AS text")

        def double(batches):
            import pyarrow.compute as pc

            for batch in batches:
                yield batch.set_column(0, "id", pc.multiply(batch.column(0), 2))

        total = frame.mapInArrow(double, frame.schema).groupBy().sum("id").collect()[0][0]
    finally:
        spark.stop()
    if columns != list(KAFKA_COLUMNS):
        problems.append(f"the Kafka source has columns {columns}, not {list(KAFKA_COLUMNS)} (spark.records)")
    if local_types != source_types:
        problems.append(f"a small batch's local relation has {local_types}, the Kafka source {source_types}")
    if tuple(local_row) != (2, 7, 1_700_000_000_123):
        problems.append(f"a small batch's local relation gave (partition, offset, ms) {tuple(local_row)}, not "
                        "(2, 7, 1700000000123)")
    if total != 2 * sum(range(1000)):
        problems.append(f"mapInArrow summed to {total}, not {2 * sum(range(1000))}")
    if iceberg_runtime and iceberg_rows != [(0, 3), (1, 3)]:
        problems.append(f"two appends of 3 rows to an Iceberg table with {iceberg_runtime} read back as {iceberg_rows}, "
                        "not [(0, 3), (1, 3)] (rows per append)")
    return {"kafka_columns": columns, "local_relation_types": local_types, "map_in_arrow_sum": total,
            "iceberg_rows_per_append": iceberg_rows, "seconds": round(time.monotonic() - started, 1)}


def _iceberg_append(spark: Any) -> list[tuple[int, int]]:
    """Two appends to a new table of Iceberg's Hadoop catalog (a temporary folder); rows per append, read back."""
    warehouse = tempfile.mkdtemp(prefix="aeo-install-check-iceberg-")
    spark.conf.set("spark.sql.catalog.check", "org.apache.iceberg.spark.SparkCatalog")
    spark.conf.set("spark.sql.catalog.check.type", "hadoop")
    spark.conf.set("spark.sql.catalog.check.warehouse", warehouse)
    spark.range(3).selectExpr("0 AS append", "id").writeTo("check.db.rows").using("iceberg").create()
    spark.range(3).selectExpr("1 AS append", "id").writeTo("check.db.rows").append()
    counted = spark.table("check.db.rows").groupBy("append").count().orderBy("append").collect()
    return [(row[0], row[1]) for row in counted]


if __name__ == "__main__":
    sys.exit(main())
