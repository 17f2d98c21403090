"""`python -m devtools ...`: fetch jars, build the Schema Registry, start or stop the local broker, PostgreSQL or
Spark cluster, write docker/docker-compose.yml."""

from __future__ import annotations

import argparse
import sys

from devtools.iceberg_rest import rest_server_jar
from devtools.kafka_broker import LocalKafkaBroker, stop_pidfile
from devtools.maven import avro_jars, delta_jars, devenv_home, kafka_broker_jars, spark_kafka_jars
from devtools.object_storage import s3proxy_jar
from devtools.postgres import LocalPostgres, stop_data_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch-jars", help="fetch the Kafka broker, spark-sql-kafka, Iceberg REST server, s3proxy and Delta reader jars with Maven")
    sub.add_parser("build-registry", help="build the local Schema Registry (Apicurio) with Maven, once")
    start = sub.add_parser("kafka-start", help="start a local broker in the background")
    start.add_argument("--port", type=int, default=9092)
    start.add_argument("--controller-port", type=int, default=9093)
    start.add_argument("--data-dir", default=str(devenv_home() / "kafka"))
    stop = sub.add_parser("kafka-stop", help="stop the broker started by kafka-start")
    stop.add_argument("--data-dir", default=str(devenv_home() / "kafka"))
    pg_start = sub.add_parser("postgres-start", help="start a local PostgreSQL server in the background")
    pg_start.add_argument("--port", type=int, default=5432)
    pg_start.add_argument("--data-dir", default=str(devenv_home() / "postgres"))
    pg_start.add_argument("--max-prepared-transactions", type=int, default=20)
    pg_start.add_argument("--database", action="append", default=[],
                          help="create this database too (repeatable)")
    pg_stop = sub.add_parser("postgres-stop", help="stop the server started by postgres-start")
    pg_stop.add_argument("--data-dir", default=str(devenv_home() / "postgres"))
    pg_stop.add_argument("--mode", choices=["fast", "immediate", "smart"], default="fast")
    spark_start = sub.add_parser("spark-start", help="start a local Spark standalone master and worker(s)")
    spark_start.add_argument("--port", type=int, default=7077)
    spark_start.add_argument("--webui-port", type=int, default=8080)
    spark_start.add_argument("--workers", type=int, default=1)
    spark_start.add_argument("--data-dir", default=str(devenv_home() / "spark"))
    spark_stop = sub.add_parser("spark-stop", help="stop the cluster started by spark-start")
    spark_stop.add_argument("--data-dir", default=str(devenv_home() / "spark"))
    compose = sub.add_parser("docker-compose", help="print docker/docker-compose.yml as generated from the "
                                                    "tests' settings")
    compose.add_argument("--write", action="store_true", help="write it instead of printing it")
    args = parser.parse_args(argv)

    if args.command == "fetch-jars":
        print(f"Kafka broker jars: {kafka_broker_jars()}")
        print(f"spark-sql-kafka jars: {len(spark_kafka_jars())} files, spark-avro: {len(avro_jars())}")
        print(f"Iceberg REST catalog server: {rest_server_jar()}")
        print(f"Delta's Spark reader (the Delta sink's tests): {len(delta_jars())} files")
        print(f"S3-compatible server (s3proxy): {s3proxy_jar()}")
    elif args.command == "build-registry":
        from devtools.schema_registry import apicurio_version, registry_app

        print(f"Schema Registry (Apicurio {apicurio_version()}): {registry_app()}")
    elif args.command == "kafka-start":
        broker = LocalKafkaBroker(args.data_dir, port=args.port, controller_port=args.controller_port).start()
        broker.process = None  # leave it running after this command exits
        print(f"Kafka broker ready at {broker.bootstrap_servers} (data in {args.data_dir})")
    elif args.command == "kafka-stop":
        print("stopped" if stop_pidfile(args.data_dir) else "no broker was running")
    elif args.command == "postgres-start":
        server = LocalPostgres(args.data_dir, port=args.port,
                               max_prepared_transactions=args.max_prepared_transactions).start()
        for name in args.database:
            server.create_database(name)
        # pg_ctl runs the server detached: it keeps running after this command exits.
        print(f"PostgreSQL ready at {server.url(args.database[0] if args.database else 'postgres')} "
              f"(data in {args.data_dir}, log {server.log_file})")
    elif args.command == "postgres-stop":
        print("stopped" if stop_data_dir(args.data_dir, mode=args.mode) else "no PostgreSQL server was running")
    elif args.command == "spark-start":
        from devtools.spark_cluster import LocalSparkCluster

        cluster = LocalSparkCluster(args.data_dir, workers=args.workers, master_port=args.port,
                                    webui_port=args.webui_port).start()
        cluster.processes.clear()  # leave it running after this command exits
        print(f"Spark master ready at {cluster.master_url} (web UI {cluster.webui_url}, logs in {args.data_dir})")
    elif args.command == "spark-stop":
        from devtools.spark_cluster import stop_pidfile as stop_spark

        print("stopped" if stop_spark(args.data_dir) else "no Spark cluster was running")
    elif args.command == "docker-compose":
        from devtools import docker_stack

        if args.write:
            print(f"wrote {docker_stack.write()}")
        else:
            print(docker_stack.render(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
