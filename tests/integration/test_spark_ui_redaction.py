"""A REST catalog's `credential` and `Authorization` header, set in a Spark session by the Iceberg sink
(sink_writer.configure_catalog), are `***` on Spark's UI: its SQL tab lists every setting a query's session changed
and, by default, shows these two in plain text (the control below shows it does).

A local Spark session with its UI on, in a process of its own (the test session's Spark has no UI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# (values without "secret", "password" or "token": Spark redacts a setting whose value matches its pattern too)
CREDENTIAL, HEADER = "nst-client:plain-4711", "Bearer plain-4712"

PROBE = textwrap.dedent("""
    import json, sys, urllib.request
    from pyspark.sql import SparkSession
    from airflow_exactly_once.sinks.iceberg.sink_writer import configure_catalog

    credential, header = sys.argv[1], sys.argv[2]
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "true").config("spark.ui.port", "0")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    pages = {}
    try:
        # the control: set as any code sets a session setting
        spark.conf.set("spark.sql.catalog.plain.credential", credential)
        spark.conf.set("spark.sql.catalog.plain.header.Authorization", header)
        spark.range(3).selectExpr("sum(id)").collect()
        spark.conf.unset("spark.sql.catalog.plain.credential")
        spark.conf.unset("spark.sql.catalog.plain.header.Authorization")
        # as the sink sets its catalog
        configure_catalog(spark, {"spark.sql.catalog.rest.credential": credential,
                                  "spark.sql.catalog.rest.header.Authorization": header})
        spark.range(3).selectExpr("sum(id)").collect()
        for execution in (0, 1):
            url = f"{spark.sparkContext.uiWebUrl}/SQL/execution/?id={execution}"
            pages[execution] = urllib.request.urlopen(url, timeout=60).read().decode()
    finally:
        spark.stop()
    print(json.dumps(pages))
""")


def test_the_sinks_catalog_secrets_are_redacted_on_sparks_sql_tab(tmp_path):
    result = subprocess.run([sys.executable, "-c", PROBE, CREDENTIAL, HEADER], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    control, sink = json.loads(result.stdout.strip().splitlines()[-1]).values()
    # Spark shows both in plain text when nothing widens its redaction ...
    assert "spark.sql.catalog.plain.credential" in control and CREDENTIAL in control and HEADER in control
    # ... and redacts them once the sink has set its catalog.
    assert "spark.sql.catalog.rest.credential" in sink and "spark.sql.catalog.rest.header.Authorization" in sink
    assert CREDENTIAL not in sink and HEADER not in sink
    assert "*********(redacted)" in sink
