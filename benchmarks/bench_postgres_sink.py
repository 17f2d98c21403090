"""Rows per second into PostgreSQL: the exactly-once sink vs Spark's own JDBC writer.

One run, one Spark session, one cached DataFrame, one throwaway PostgreSQL server; the two
writers take turns (order alternates per round) into the same table, emptied before each
write. The exactly-once figure covers the whole write + notify_complete path of the sink
(PREPARE TRANSACTION per partition, then COMMIT PREPARED); the baseline is
`DataFrame.write.jdbc(mode="append")` with its defaults (at least once: a retried task
writes its rows again).

    python benchmarks/bench_postgres_sink.py [--rows 1000000] [--rounds 3] [--partitions 4]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from airflow_exactly_once.core.model import Batch
from airflow_exactly_once.core.states import BatchState
from devtools.maven import postgres_jdbc_jars, use_prefetched_connector
from devtools.postgres import LocalPostgres
from airflow_exactly_once.sinks import create_committer, create_writer
from airflow_exactly_once.spark.in_process_session import build_spark_session
from airflow_exactly_once.spark.partition_writers import run_partition_writers

TABLE = "bench_rows"
DDL = f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, name text, amount double precision, ts timestamptz)"


def write_exactly_once(writer, committer, df, seq: int) -> None:
    batch = Batch(pipeline_id="bench", seq=seq, run_id=f"bench-{seq}", state=BatchState.PLANNED, epoch=1,
                  ranges=())
    committer.commit(batch, writer.stage(df, batch, run_partition_writers))


def write_jdbc(df, server: LocalPostgres) -> None:
    df.write.jdbc(f"jdbc:postgresql://127.0.0.1:{server.port}/bench", TABLE, mode="append",
                  properties={"user": "postgres", "driver": "org.postgresql.Driver"})


def main() -> int:
    use_prefetched_connector()  # the Kafka connector jars fetched by `make setup`
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="aeo-bench-pg-"))
    server = LocalPostgres(root, max_prepared_transactions=64).start()
    spark = build_spark_session("bench-postgres-sink", {"spark.master": "local[*]",
                                                         "spark.jars": ",".join(postgres_jdbc_jars())})
    try:
        server.create_database("bench")
        server.psql(DDL, dbname="bench")
        spec = {"type": "postgres", "url": server.dsn("bench"), "table": TABLE}
        sink, writer = create_committer(spec), create_writer(spec)
        sink.check("bench")
        df = spark.range(0, args.rows, numPartitions=args.partitions).selectExpr(
            "id", "concat('name-', id) AS name", "id * 0.5 AS amount",
            "timestamp_seconds(1700000000 + id) AS ts").cache()
        assert df.count() == args.rows  # materialised once: both writers read the same cached rows

        writers = {"exactly_once": lambda seq: write_exactly_once(writer, sink, df, seq),
                   "spark_jdbc": lambda seq: write_jdbc(df, server)}
        seconds: dict[str, list[float]] = {name: [] for name in writers}
        for round_no in range(args.rounds):
            order = list(writers) if round_no % 2 == 0 else list(writers)[::-1]
            for name in order:
                server.psql(f"TRUNCATE {TABLE}", dbname="bench")
                started = time.perf_counter()
                writers[name](round_no + 1)
                seconds[name].append(time.perf_counter() - started)
                count = int(server.psql(f"SELECT count(*) FROM {TABLE}", dbname="bench"))
                assert count == args.rows, f"{name} wrote {count} rows, expected {args.rows}"
                assert server.psql("SELECT count(*) FROM pg_prepared_xacts").strip() == "0"
                print(f"round {round_no + 1} {name:13s} {seconds[name][-1]:7.2f} s "
                      f"{args.rows / seconds[name][-1]:>10,.0f} rows/s", flush=True)

        medians = {name: statistics.median(values) for name, values in seconds.items()}
        rates = {name: args.rows / m for name, m in medians.items()}
        result = {"rows": args.rows, "partitions": args.partitions, "rounds": args.rounds,
                  "median_seconds": medians, "median_rows_per_second": rates,
                  "ratio_exactly_once_to_jdbc": rates["exactly_once"] / rates["spark_jdbc"]}
        print(f"median: exactly-once {rates['exactly_once']:,.0f} rows/s, Spark JDBC {rates['spark_jdbc']:,.0f} "
              f"rows/s, ratio {result['ratio_exactly_once_to_jdbc']:.2f}")
        print(json.dumps(result))
    finally:
        spark.stop()
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
