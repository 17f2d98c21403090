"""Without any connector settings, Spark resolves its Kafka connector by itself: no Maven, no devtools.

A fresh driver process (the session's own Spark already has the pre-fetched jars) with an
empty SPARK_CONF_DIR and an empty Ivy cache reads a real topic through the production path
(airflow_exactly_once.spark.in_process_session + spark.packages).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.helpers import create_topic, produce

READ = textwrap.dedent("""
    import sys
    from airflow_exactly_once.spark.in_process_session import build_spark_session

    spark = build_spark_session("connector-test", {"spark.master": "local[1]", "spark.jars.ivy": sys.argv[3]})
    frame = spark.read.format("kafka").option("kafka.bootstrap.servers", sys.argv[1]) \\
        .option("subscribe", sys.argv[2]).load()
    print("records", frame.count())
    print("jars", spark.sparkContext.getConf().get("spark.jars.packages"))
    spark.stop()
""")


def test_spark_resolves_the_connector_of_the_installed_pyspark(kafka, tmp_path, unique):
    topic = f"connector-{unique}"
    create_topic(kafka.bootstrap_servers, topic, partitions=1)
    produce(kafka.bootstrap_servers, topic, 7, partitions=1)
    (tmp_path / "conf").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}
    env["SPARK_CONF_DIR"] = str(tmp_path / "conf")  # no spark-defaults.conf naming the connector
    run = subprocess.run([sys.executable, "-c", READ, kafka.bootstrap_servers, topic, str(tmp_path / "ivy")],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "records 7" in run.stdout
    assert "spark-sql-kafka-0-10" in run.stdout
    resolved = list((tmp_path / "ivy" / "jars").glob("*spark-sql-kafka-0-10*.jar"))
    assert resolved, "Spark did not resolve the connector into the given Ivy folder"


def test_the_resolved_connector_jars_stay_off_the_python_workers_path(spark):
    """Spark adds the jars it resolves from spark.jars.packages to the Python includes as well; the session
    takes ours off again (they carry no Python), and Python tasks still run (spark.in_process_session).
    The tests' session may load the connector from prefetched jars instead: then there are none to take off."""
    assert [name for name in spark.sparkContext._python_includes if name.endswith(".jar")] == []

    def pids(batches):
        import os

        import pyarrow as pa
        yield pa.RecordBatch.from_pydict({"rows": [sum(b.num_rows for b in batches)], "pid": [os.getpid()]})

    rows = spark.range(0, 40, 1, 4).mapInArrow(pids, "rows long, pid long").collect()
    assert sum(r.rows for r in rows) == 40
