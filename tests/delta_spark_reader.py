"""Spark's own Delta reader and writer in a process of their own, for the Delta sink's tests.

Spark's Delta needs its extension and catalog set when the session starts, which the tests' shared
session (and a write task's) does not have; so this process starts one with Delta's jars, and
answers one JSON request per line on stdin with one JSON line on stdout:

    {"op": "read", "path": ..., "version": null | n}      -> {"rows": [{...}, ...]}
    {"op": "history", "path": ...}                         -> {"versions": [[version, operation], ...]}
    {"op": "append", "path": ..., "rows": [...], "schema": "id BIGINT, ..."}  -> {"ok": true}
    {"op": "sql", "statement": ...}                        -> {"ok": true}
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from airflow_exactly_once.sinks.delta.runtime import CATALOG, EXTENSION

REPO = Path(__file__).resolve().parent.parent


def serve(jars: list[str]) -> None:
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").appName("delta-reader").config("spark.jars", ",".join(jars))
             .config("spark.sql.extensions", EXTENSION).config("spark.sql.catalog.spark_catalog", CATALOG)
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.databricks.delta.snapshotPartitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = handle(spark, request)
        except Exception as exc:  # noqa: BLE001 - the test reads Spark's error
            answer = {"error": f"{type(exc).__name__}: {str(exc)[:3000]}"}
        print(json.dumps(answer, default=str), flush=True)
    spark.stop()


def handle(spark: Any, request: dict[str, Any]) -> dict[str, Any]:
    op = request["op"]
    if op == "read":
        reader = spark.read.format("delta")
        if request.get("version") is not None:
            reader = reader.option("versionAsOf", request["version"])
        return {"rows": [row.asDict() for row in reader.load(request["path"]).collect()]}
    if op == "history":
        rows = spark.sql(f"DESCRIBE HISTORY delta.`{request['path']}`").select("version", "operation").collect()
        return {"versions": sorted([r["version"], r["operation"]] for r in rows)}
    if op == "append":
        spark.createDataFrame(request["rows"], request["schema"]).write.format("delta").mode("append") \
            .save(request["path"])
        return {"ok": True}
    if op == "sql":
        spark.sql(request["statement"]).collect()
        return {"ok": True}
    raise ValueError(f"unknown op {op!r}")


class SparkDeltaReader:
    """The reader process, started once per test module (a JVM start): `ask(op=..., ...)` sends one request.

    Its JVM starts while the tests go on: the first request waits for it to be ready, not the constructor."""

    def __init__(self) -> None:
        from devtools.maven import delta_jars

        self.process = subprocess.Popen([sys.executable, "-m", "tests.delta_spark_reader", json.dumps(delta_jars())],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
        self.ready = False

    def _wait_ready(self) -> None:
        if not self.ready:
            started = self._answer()
            if not started.get("ready"):
                raise RuntimeError(f"Spark's Delta reader did not start: {started}")
            self.ready = True

    def _answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"Spark's Delta reader ended (exit {self.process.poll()})")
            if line.startswith("{"):
                return json.loads(line)

    def ask(self, **request: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self._wait_ready()
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self._answer()
        if "error" in answer and request.get("op") != "append":
            raise RuntimeError(answer["error"])
        return answer

    def rows(self, path: Path, version: int | None = None) -> list[dict[str, Any]]:
        return self.ask(op="read", path=str(path), version=version)["rows"]

    def versions(self, path: Path) -> list[list[Any]]:
        return self.ask(op="history", path=str(path))["versions"]

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]))
