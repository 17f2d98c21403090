"""No secret at rest or on screen (issue 25): a distinct secret in every place a user can give one, searched for
in every store and output of a real Airflow after a good run and a failing one.

The places (tests/conftest.py NO_SECRET_MARKERS, given by tests/dags/eo_no_secret_test_dag.py): the Kafka
connection's SASL password (the secured broker's login of NO_SECRET_USER, so the runs prove it was used),
`kafka_config`, the Schema Registry connection's password (the session registry's login of
NO_SECRET_REGISTRY_USER: the `pg` pipeline decodes its Avro records through it), a PostgreSQL sink's and
dead-letter table's `url`, an Iceberg PostgreSQL catalog's `url` and a
secret catalog property (`s3.secret-access-key`), the
PostgreSQL ledger connection's password, a Spark Connect connection's token and a `spark_conf` entry; the `aws`
connection of a Parquet sink on object storage (its secret access key and session token: this test's own s3proxy
takes that secret key, so the runs prove it was used), and an Iceberg REST catalog's connection (an OAuth2 client
secret, which a gateway in front of the catalog exchanges for a bearer token that is a marker too: every catalog
request of pyiceberg and Spark carries it, and the gateway refuses any other). The test
PostgreSQL trusts local logins, so the passwords in URLs and connections are planted, not checked, by it.

The stores: both ledgers (the embedded SQLite file's bytes and tables; every table of the PostgreSQL
database, which also holds the sink's, dead-letter and Iceberg catalog tables), Airflow's metadata database
(bytes and every column of every table: XComs, rendered template fields, Asset event extras, serialized DAGs,
...), every log of the stack (task logs, scheduler, dag-processor, api-server), the PostgreSQL server's log,
the Iceberg warehouse's files, the objects of the S3-compatible server (and its log), the REST catalog server's
database, warehouse and log, the Spark Connect server's log (its UI is off, as on the test stack), the ledger
page and its API, Airflow's REST API for the runs' task instances, and the CLI's output (plain and --json). The failing run's write points at a Spark Connect port nobody listens
on, with the token in its connection: its error is in the task log, the ledger's batch error and events.

A finding names the secret, the store (file, or table and column) and the text around it with every secret
replaced by its place: what the mechanism must still cover.
"""

from __future__ import annotations

import contextlib
import io
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from kafka import KafkaProducer

from airflow_exactly_once.cli.main import main as cli_main
from airflow_exactly_once.core.ledger import Ledger
from airflow_exactly_once.hooks.ledger import EMBEDDED_LEDGER_FILE
from devtools.object_storage import LocalObjectStorage, committed_rows
from devtools.ports import reserve_port
from devtools.rest_gateway import RestGateway
from tests.conftest import (AIRFLOW_DATABASE, NO_SECRET_MARKERS, NO_SECRET_REGISTRY_USER, NO_SECRET_USER, PG_DATABASE,
                            SECURED_IN)
from tests.dags.eo_no_secret_test_dag import AWS_CONN_ID, KAFKA_CONN_ID, LEDGER_CONN_ID, REGISTRY_CONN_ID, REST_CONN_ID
from tests.no_secret import SPARK_CONF_ENV
from tests.no_secret import airflow_env as no_secret_env
from tests.helpers import client_args, create_topic, pg_query
from tests.secret_search import Store, files, find_secrets, postgres_tables, sqlite_tables

DAG = "eo_no_secret_test"
DEAD_CONNECT_CONN_ID = "eo_nst_dead_connect"
REST_CLIENT_ID = "nst-client"
# Stores that hold table or object files, which nothing ties to the pipelines' names (each group is checked to hold
# what the runs wrote instead).
FILE_STORES = ("Iceberg warehouse", "object storage (s3proxy)", "Iceberg REST catalog server", "Spark Connect server")
# Batch 2 is the failing run's (aborted, with its error).
CLI_COMMANDS = (["pipelines"], ["batches", "{p}"], ["show", "{p}", "1"], ["show", "{p}", "2"], ["events", "{p}"],
                ["check", "{p}"])


ORDER = {"type": "record", "name": "Order", "namespace": "nst",
         "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "long"}]}


def produce_avro(admin: dict, registry, topic: str, start: int, count: int) -> None:
    """Records {"id", "amount"} in the wire format (the schema registered by the registry's own user); amount 0
    (every fourth) makes guarded_share mark the record bad: dead letters."""
    serialize = AvroSerializer(SchemaRegistryClient(registry.client_config()), json.dumps(ORDER))
    context = SerializationContext(topic, MessageField.VALUE)
    producer = KafkaProducer(**client_args(admin), acks="all")
    for i in range(start, start + count):
        producer.send(topic, key=str(i).encode(), value=serialize({"id": i, "amount": i % 4}, context),
                      partition=i % 3)
    producer.flush()
    producer.close()


def http_get(airflow, path: str) -> str:
    request = urllib.request.Request(airflow.base_url + path)
    request.add_header("Authorization", f"Bearer {airflow._token}")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read().decode(errors='replace')}"


def cli_output(ledger_url: str, pipeline: str) -> list[Store]:
    """What `airflow-exactly-once <command>` prints (stdout and stderr), plain and --json."""
    outputs = []
    for command in CLI_COMMANDS:
        for json_flag in ([], ["--json"]):
            argv = ["--ledger-url", ledger_url, *json_flag, *[a.format(p=pipeline) for a in command]]
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = cli_main(argv)
            outputs.append((f"CLI `airflow-exactly-once {' '.join(argv[2:])}` (ledger {pipeline})",
                            f"exit {code}\n{out.getvalue()}\n{err.getvalue()}"))
    return outputs


def rest_table_rows(gateway: RestGateway, table: str) -> int:
    """The REST catalog table's rows as pyiceberg reads them through the gateway (with the token)."""
    from pyiceberg.catalog.rest import RestCatalog

    catalog = RestCatalog("nst_check", uri=gateway.uri, token=NO_SECRET_MARKERS["rest-catalog-token"])
    return catalog.load_table(table).scan().to_arrow().num_rows


@pytest.fixture
def nst_storage(tmp_path):
    """Object storage whose only secret key is the `aws` connection's (a wrong or unused key fails the runs)."""
    storage = LocalObjectStorage(tmp_path / "s3", secret_key=NO_SECRET_MARKERS["aws-conn-secret-access-key"]).start()
    yield storage
    storage.stop()


@pytest.fixture
def nst_gateway(iceberg_rest):
    """The REST catalog behind a gateway that takes only the connection's client secret (exchanged for the token
    marker) or that token."""
    with RestGateway(iceberg_rest.uri, token=NO_SECRET_MARKERS["rest-catalog-token"],
                     credential=f"{REST_CLIENT_ID}:{NO_SECRET_MARKERS['rest-conn-client-secret']}") as gateway:
        yield gateway


# Four pipelines a run (pg, ice, s3, rest) and the whole search: over the default 900 s under a load average of 25.
@pytest.mark.timeout(1800)
def test_no_secret_reaches_any_store_or_output(secured_kafka, postgres, airflow, airflow_database, warm_spark,
                                              spark_connect, iceberg_rest, nst_storage, nst_gateway,
                                              openlineage_events, schema_registry, tmp_path, unique):
    storage, gateway = nst_storage, nst_gateway
    admin = secured_kafka.client_config()
    prefix, table = f"nst-{unique}", f"nst_{unique}"
    topic = f"{SECURED_IN}nst-{unique}"
    create_topic(admin, topic, partitions=3)
    dsn = postgres.dsn(PG_DATABASE)
    pg_query(dsn, f'CREATE TABLE "{table}" (id BIGINT, share BIGINT)')
    bucket = storage.create_bucket(f"nst-{unique}")

    # Where the DAG takes its secrets from: connections, and Variables (and spark_conf) in the stack's environment.
    airflow.put_connection(KAFKA_CONN_ID, {"conn_type": "kafka", "extra": json.dumps(
        secured_kafka.connection_extra(NO_SECRET_USER))})
    # the registry's user NO_SECRET_REGISTRY_USER has this password (tests/conftest.py): a wrong one fails the runs
    assert schema_registry.users[NO_SECRET_REGISTRY_USER] == NO_SECRET_MARKERS["registry-conn-password"]
    airflow.put_connection(REGISTRY_CONN_ID, {
        "conn_type": "schema_registry", "host": schema_registry.url, "login": NO_SECRET_REGISTRY_USER,
        "password": NO_SECRET_MARKERS["registry-conn-password"]})
    airflow.put_connection(LEDGER_CONN_ID, {
        "conn_type": "postgres", "host": "127.0.0.1", "port": postgres.port, "login": "postgres",
        "password": NO_SECRET_MARKERS["ledger-conn-password"], "schema": PG_DATABASE})
    dead_port = reserve_port()  # reserved by this session, never listened on
    airflow.put_connection(DEAD_CONNECT_CONN_ID, {
        "conn_type": "spark_connect", "host": "127.0.0.1", "port": dead_port,
        "extra": json.dumps({"token": NO_SECRET_MARKERS["spark-connect-token"]})})
    airflow.put_connection(AWS_CONN_ID, {
        "conn_type": "aws", "login": storage.access_key, "password": NO_SECRET_MARKERS["aws-conn-secret-access-key"],
        "extra": json.dumps({"endpoint_url": storage.endpoint_url, "region_name": "us-east-1",
                             "aws_session_token": NO_SECRET_MARKERS["aws-conn-session-token"]})})
    airflow.put_connection(REST_CONN_ID, {"conn_type": "http", "host": gateway.uri, "login": REST_CLIENT_ID,
                                          "password": NO_SECRET_MARKERS["rest-conn-client-secret"]})
    stack_env = airflow.env()
    assert all(stack_env[k] == v for k, v in no_secret_env(NO_SECRET_MARKERS, postgres.port, PG_DATABASE).items())
    assert SPARK_CONF_ENV in stack_env
    airflow.wait_for_dag(DAG)

    conf = {"prefix": prefix, "topic": topic, "table": table, "warehouse": str(tmp_path / "lake"), "bucket": bucket,
            **warm_spark}
    runs = [f"{prefix}-1", f"{prefix}-fail"]
    produce_avro(admin, schema_registry, topic, 0, 90)
    assert airflow.run(DAG, runs[0], conf) == "success", airflow.task_states(DAG, runs[0])
    produce_avro(admin, schema_registry, topic, 90, 30)
    assert airflow.run(DAG, runs[1], {**conf, "spark_conn_id": DEAD_CONNECT_CONN_ID}) == "failed"
    states = airflow.task_states(DAG, runs[1])
    assert states["write"][0] == "failed" and states["abort"][0] == "success", states
    # The good run wrote (ids 0..89: every fourth, amount 0, is a dead letter), the `pg` pipeline's records decoded
    # through the registry with the planted password; the failing one's error is about its server.
    assert pg_query(dsn, f'SELECT count(*) FROM "{table}"') == [(67,)]
    assert pg_query(dsn, f'SELECT sum(id) FROM "{table}"') == [(sum(i for i in range(90) if i % 4),)]
    assert pg_query(dsn, f'SELECT count(*) FROM "{table}_dead_letter"') == [(23,)]
    # The object storage and the REST catalog took the connections' secrets: both hold the 90 records of the good run.
    assert len(committed_rows(storage.client(), bucket, prefix, ["offset"])) == 90  # `v`: Avro bytes, not UTF-8
    assert rest_table_rows(gateway, f"db.{table}") == 90
    failed_write_log = "\n".join(airflow.task_log(DAG, runs[1], f"{g}.write") for g in ("pg", "ice", "s3", "rest"))
    assert f"127.0.0.1:{dead_port}" in failed_write_log, failed_write_log[-3000:]

    home = Path(airflow.home)
    embedded = home / EMBEDDED_LEDGER_FILE
    pg_ledger = f"postgresql+psycopg2://postgres@127.0.0.1:{postgres.port}/{PG_DATABASE}"
    # Every secret reached the pipelines: the ledgers keep "***" where each was (none of them was left out).
    pg_config = Ledger(f"sqlite:///{embedded}").pipeline(f"{prefix}-pg")["config"]
    ice_config = Ledger(pg_ledger).pipeline(f"{prefix}-ice")["config"]
    for config in (pg_config, ice_config):
        assert config["kafka_config"]["sasl.password"] == config["kafka_config"]["ssl.key.password"] == "***", config
    assert pg_config["schema_registry"]["basic.auth.user.info"] == "***", pg_config
    assert "postgres:***@" in pg_config["sink"]["url"] and "postgres:***@" in pg_config["dead_letter"]["url"], pg_config
    assert "postgres:***@" in ice_config["sink"]["catalog"]["url"], ice_config
    assert ice_config["sink"]["catalog"]["properties"]["s3.secret-access-key"] == "***", ice_config
    groups: dict[str, list[Store]] = {
        "ledger (embedded SQLite)": [
            *[s for p in sorted(home.glob(EMBEDDED_LEDGER_FILE + "*")) for s in files(p, f"file {p.name}")],
            *sqlite_tables(embedded, "embedded ledger")],
        "PostgreSQL (ledger, sink, dead letters, Iceberg catalog)": [
            *postgres_tables(dsn, f"PostgreSQL {PG_DATABASE}"), *files(postgres.log_file, "PostgreSQL server log")],
        "Airflow metadata database": [
            *postgres_tables(airflow_database.dsn(AIRFLOW_DATABASE), "Airflow metadata"),
            *files(airflow_database.log_file, "its PostgreSQL server log")],
        "Airflow logs": [*files(home / "logs", "logs"),
                         *[s for p in sorted(home.glob("*.log")) for s in files(p, f"component log {p.name}")]],
        "Iceberg warehouse": list(files(tmp_path / "lake", "warehouse")),
        # its objects (s3proxy.conf, the server's own settings, holds the key it checks: not a store of ours)
        "object storage (s3proxy)": [*files(storage.data_dir / "blobs", "objects"),
                                     *files(storage.log_file, "s3proxy log")],
        "Iceberg REST catalog server": list(files(iceberg_rest.data_dir, "REST catalog server")),
        # the server logs an operation it drops unreleased with its plan, a write's pickled partition writer and its
        # secrets inside: every write's client must have released its operations before it closed
        "Spark Connect server": [("Spark Connect server log", spark_connect.log_file.read_text(errors="replace"))],
        "ledger page and API": [
            (f"ledger page /exactly-once/ui?pipeline={prefix}-pg",
             http_get(airflow, f"/exactly-once/ui?pipeline={prefix}-pg")),
            ("ledger API /exactly-once/api/pipelines", http_get(airflow, "/exactly-once/api/pipelines")),
            *[(f"ledger API /exactly-once/api/pipelines/{pipeline}",
               http_get(airflow, f"/exactly-once/api/pipelines/{pipeline}"))
              for pipeline in (f"{prefix}-pg", f"{prefix}-s3", f"{prefix}-rest")],
            *[(f"ledger page /exactly-once/ui?pipeline={pipeline}",
               http_get(airflow, f"/exactly-once/ui?pipeline={pipeline}")) for pipeline in (f"{prefix}-s3", f"{prefix}-rest")]],
        "Airflow REST API (task instances, rendered fields)": [
            (f"REST taskInstances of run {run}", http_get(airflow, f"/api/v2/dags/{DAG}/dagRuns/{run}/taskInstances"))
            for run in runs],
        # the DAG has lineage on: every OpenLineage event of its tasks (facets, datasets, the provider's own)
        "OpenLineage events": list(files(openlineage_events, "OpenLineage events")),
        "CLI output": [*cli_output(f"sqlite:///{embedded}", f"{prefix}-pg"), *cli_output(pg_ledger, f"{prefix}-ice"),
                       *cli_output(f"sqlite:///{embedded}", f"{prefix}-s3"),
                       *cli_output(f"sqlite:///{embedded}", f"{prefix}-rest")],
    }
    # Each group was read and holds this test's pipelines (else finding nothing there would prove nothing).
    assert any(name.endswith(".metadata.json") for name, _ in groups["Iceberg warehouse"]), groups["Iceberg warehouse"]
    assert any(f"/{prefix}/_manifest/" in name for name, _ in groups["object storage (s3proxy)"])
    assert any(table in name and name.endswith(".metadata.json") for name, _ in groups["Iceberg REST catalog server"])
    assert groups["Spark Connect server"] and all(content for _, content in groups["Spark Connect server"])
    for group, stores in groups.items():
        if group in FILE_STORES:  # table and object files, a server's own log: nothing in them names the pipeline
            continue
        assert any(prefix in (s if isinstance(s, str) else s.decode("utf-8", "replace")) for _, s in stores), \
            f"{group}: none of its {len(stores)} stores mentions pipeline prefix {prefix!r}"

    hits = [hit for stores in groups.values() for hit in find_secrets(NO_SECRET_MARKERS, stores)]
    assert not hits, f"{len(hits)} secret(s) found at rest or on screen:\n" + "\n".join(str(h) for h in hits[:80])
