"""Session fixtures: the real Kafka broker, PostgreSQL and Airflow, started by the project's own dev tooling.

If one cannot start, the fixture raises and every test that needs it errors: nothing is
skipped. Tests come in three tiers, by folder, each with its marker: tests/unit (pure logic,
no servers, seconds), tests/integration (real Kafka, PostgreSQL, Spark), tests/system (a
real Airflow running DAGs).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_exactly_once.core.faults import ENV as FAULTS_ENV
from airflow_exactly_once.spark.in_process_session import drop_stale_connect_mode
from devtools.airflow_stack import METADATA_DATABASE, AirflowStack, metadata_server
from devtools.kafka_broker import LocalKafkaBroker
from devtools.kafka_secured import Grant, SecuredKafkaBroker, pipeline_grants
from devtools.iceberg_rest import LocalIcebergRestCatalog
from devtools.maven import spark_conf_dir
from devtools.object_storage import SDK_CHECKSUM_ENV, LocalObjectStorage
from devtools.postgres import LocalPostgres
from devtools.processes import leftover_processes
from devtools.redis import LocalRedis
from devtools.rest_gateway import RestGateway
from devtools.schema_registry import LocalSchemaRegistry
from devtools.spark_connect import LocalSparkConnectServer
from tests.dags.exactly_once_connect_test_dag import SPARK_CONN_ID
from tests.no_secret import airflow_env as no_secret_env
from tests.no_secret import new_markers

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_TOPIC = "events"
PG_DATABASE = "exactly_once"  # sink tables and the PostgreSQL ledger of the tests
AIRFLOW_DATABASE = METADATA_DATABASE  # the test Airflow's metadata, on the `airflow_database` server
PG_CONN_ID = "eo_test_postgres"
PG_EXAMPLE_TOPIC = "events_pg"  # dags/kafka_to_postgres.py reads its own topic
SPARK_EXAMPLE_TOPIC = "events-on-spark"  # dags/kafka_to_parquet_on_spark.py
K2K_INPUT, K2K_OUTPUT = "k2k_events", "k2k_events_enriched"  # dags/kafka_to_kafka.py
ICEBERG_EXAMPLE_TOPIC = "events_iceberg"  # dags/kafka_to_iceberg.py
DELTA_EXAMPLE_TOPIC = "events_delta"  # dags/kafka_to_delta.py
REGISTRY_EXAMPLE_TOPIC = "orders_avro"  # dags/kafka_to_parquet_registry.py
# The secured broker (SASL_SSL, SCRAM-SHA-512, ACLs): its users and what they may do. Pipelines on it read
# topics "sec-in-*", write topics "sec-out-*" and use transactional ids "sec*" (their pipeline ids).
SECURED_CONN_ID = "kafka_secured"  # the Airflow connection of the secured broker's PIPELINE_USER
SECURED_BAD_PASSWORD_CONN_ID = "kafka_secured_bad_password"
SECURED_IN, SECURED_OUT, SECURED_TXN = "sec-in-", "sec-out-", "sec"
PIPELINE_USER = "pipeline"  # every ACL a pipeline needs
NO_TXN_USER = "no-txn"  # ... but none on transactional ids
NO_WRITE_USER = "no-write"  # ... but may only DESCRIBE the output topics
NO_READ_USER = "no-read"  # ... but may only DESCRIBE the input topics
NO_SECRET_USER = "no-secret"  # every ACL; its password is one of NO_SECRET_MARKERS
# tests/system/test_no_secret_at_rest.py: a distinct secret per place a user can give one (tests/no_secret.py PLACES),
# new each session, searched for in every store afterwards. Three are real before the test's Airflow starts: the
# secured broker's password of NO_SECRET_USER, the Schema Registry's password of NO_SECRET_REGISTRY_USER, and
# spark_conf's entry (tests/dags/eo_no_secret_test_dag.py reads it from the environment).
NO_SECRET_MARKERS = new_markers()
NO_SECRET_REGISTRY_USER = "no-secret"  # a user of the session's Schema Registry; its password is a marker
SECURED_USERS = {PIPELINE_USER: "pipeline-secret", NO_TXN_USER: "no-txn-secret", NO_WRITE_USER: "no-write-secret",
                 NO_READ_USER: "no-read-secret", NO_SECRET_USER: NO_SECRET_MARKERS["kafka-conn-sasl-password"]}
# The secured broker's OAUTHBEARER listener: an OIDC client (principal User:<client id>) with every ACL a pipeline
# needs; its secret is new each session, so a test can search every store for it.
OAUTH_CLIENT = "sec-oauth-pipeline"
OAUTH_CLIENTS = {OAUTH_CLIENT: f"SECRET-oauth-client-{uuid.uuid4().hex}"}
ARRIVAL_TOPIC = "arrivals"  # dags/kafka_to_parquet_on_arrival.py: runs when records wait
ARRIVAL_MIN_RECORDS, ARRIVAL_POLL_SECONDS = 20, 2
METRICS_PIPELINE = "eo_metrics"  # tests/dags/eo_metrics_test_dag.py: its pipeline id and input topic
# The session's Iceberg REST catalog (Iceberg's own server behind devtools.rest_gateway, which checks these as a
# platform's API gateway would): the bearer token, the OAuth2 client that may exchange its credential for it, the
# one warehouse the catalog serves.
REST_TOKEN, REST_CREDENTIAL, REST_WAREHOUSE = "rest-token-secret", "pipeline:rest-client-secret", "lake"
# Every process a test starts inherits this mark; at the end of the session none may be left.
SESSION_MARK = "AIRFLOW_EXACTLY_ONCE_TEST_SESSION"


TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "system")


def _tier(item) -> str:
    return Path(str(item.fspath)).resolve().relative_to(TESTS).parts[0]


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        tier = _tier(item)
        if tier in TIERS:
            item.add_marker(tier)
    if hasattr(config, "workerinput"):
        # A pytest-xdist worker (`make test`: a file per unit of work, handed out in the workers' collection order
        # as they free up): the longest files go first, the system tier, then integration, then the unit tier's
        # many short files, which even out the workers' ends. Every worker sorts alike, as xdist requires.
        rank = {"system": 0, "integration": 1, "unit": 2}
        items.sort(key=lambda item: rank.get(_tier(item), 1))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config) -> None:
    os.environ[SESSION_MARK] = uuid.uuid4().hex
    # A temporary folder of this session's own: pytest's shared /tmp/pytest-of-<user> is reset to
    # mode 0700 by every session that starts, after which a PostgreSQL server running as another
    # user under it (a parallel session's) can no longer open its files.
    if config.option.basetemp is None:
        config.option.basetemp = config.own_basetemp = tempfile.mkdtemp(prefix="aeo-pytest-")
    # Every Spark driver of the session (in-process, Airflow tasks, spark-submit) loads the Kafka
    # connector fetched in advance; tests/integration/test_spark_connector.py covers the resolution
    # that runs when a user names no connector.
    os.environ["SPARK_CONF_DIR"] = str(spark_conf_dir(tempfile.mkdtemp(prefix="aeo-test-spark-conf-")))
    # Java's AWS SDK (Iceberg's S3FileIO in every Spark of the session) sends only the checksums s3proxy takes.
    os.environ.update(SDK_CHECKSUM_ENV)


def pytest_unconfigure(config) -> None:
    shutil.rmtree(os.environ.pop("SPARK_CONF_DIR", ""), ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    """Fail the run if a broker, PostgreSQL, Spark JVM or Airflow process outlived its test session.

    In-process Spark counts too: fixtures end their driver JVM with spark.session.stop_spark.
    """
    leftovers = leftover_processes(SESSION_MARK, os.environ[SESSION_MARK])
    if leftovers:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = "\n  ".join(leftovers)
        message = f"{len(leftovers)} process(es) started by this test session were still running (now killed):\n  {lines}"
        if reporter is not None:
            reporter.write_line(message, red=True)
        else:
            print(message)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    own = getattr(session.config, "own_basetemp", None)
    if own and session.exitstatus == pytest.ExitCode.OK:  # kept after a failure, for its logs
        shutil.rmtree(own, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory) -> LocalKafkaBroker:
    broker = LocalKafkaBroker(tmp_path_factory.mktemp("kafka"), transaction_max_timeout_ms=900_000)
    broker.start()
    yield broker
    broker.stop()


def secured_grants() -> list[Grant]:
    def grants(user: str, without: tuple[str, ...] = ()) -> list[Grant]:
        return pipeline_grants(user, SECURED_IN, SECURED_OUT, SECURED_TXN, without)

    return (grants(PIPELINE_USER) + grants(NO_TXN_USER, ("transactional_id",))
            + grants(NO_WRITE_USER, ("output",)) + [Grant(NO_WRITE_USER, "DESCRIBE", "TOPIC", SECURED_OUT, True)]
            + grants(NO_READ_USER, ("input",)) + [Grant(NO_READ_USER, "DESCRIBE", "TOPIC", SECURED_IN, True)]
            + grants(NO_SECRET_USER) + grants(OAUTH_CLIENT))


@pytest.fixture(scope="session")
def object_storage(tmp_path_factory) -> LocalObjectStorage:
    """An S3-compatible server (s3proxy, filesystem backend) for this worker: `endpoint_url`, `connection()`,
    `client()`, `create_bucket()`, and `restart()` on the same port and data."""
    server = LocalObjectStorage(tmp_path_factory.mktemp("object-storage"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def secured_kafka(tmp_path_factory) -> SecuredKafkaBroker:
    """The secured broker, started only in sessions with a test that asks for it."""
    broker = SecuredKafkaBroker(tmp_path_factory.mktemp("kafka-secured"), users=SECURED_USERS,
                                oauth_clients=OAUTH_CLIENTS, transaction_max_timeout_ms=900_000)
    broker.start()
    try:
        broker.grant(secured_grants())
    except BaseException:
        broker.stop()
        raise
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory) -> LocalSchemaRegistry:
    """A Confluent-compatible Schema Registry (Apicurio) with basic auth (and bearer tokens: `bearer_token()`) on
    and an HTTPS listener that requires a client certificate; `url`, `user`, `password`, `client_config()`, and
    `stop()`/`start()` on the same port (its H2 file keeps the schemas and their ids)."""
    registry = LocalSchemaRegistry(tmp_path_factory.mktemp("schema-registry"), user="registry",
                                   password="registry-secret", tls=True,
                                   users={NO_SECRET_REGISTRY_USER: NO_SECRET_MARKERS["registry-conn-password"]})
    registry.start()
    yield registry
    registry.stop()


@pytest.fixture(scope="session")
def iceberg_rest(tmp_path_factory) -> LocalIcebergRestCatalog:
    """Iceberg's own REST catalog server (iceberg-open-api; its tables in an SQLite file, so `kill()` then `start()`
    keeps them), one per test worker, started only by the tests that need it."""
    with LocalIcebergRestCatalog(tmp_path_factory.mktemp("iceberg-rest")) as server:
        yield server


@pytest.fixture(scope="session")
def iceberg_rest_s3(tmp_path_factory, object_storage) -> LocalIcebergRestCatalog:
    """A second REST catalog server whose warehouse is on this worker's s3proxy (`properties["warehouse"]`,
    s3://<a bucket of its own>/lake): it writes table metadata there with Iceberg's S3FileIO."""
    bucket = object_storage.create_bucket(f"rest-lake-{uuid.uuid4().hex[:8]}")
    with LocalIcebergRestCatalog(tmp_path_factory.mktemp("iceberg-rest-s3"), env=SDK_CHECKSUM_ENV,
                                 properties=object_storage.iceberg_properties(f"s3://{bucket}/lake")) as server:
        yield server


@pytest.fixture(scope="session")
def rest_gateway(iceberg_rest) -> RestGateway:
    """The REST catalog as the sink reaches it: through a gateway that requires REST_TOKEN (or REST_CREDENTIAL's
    OAuth2 exchange), serves the warehouse REST_WAREHOUSE only, and can lose or delay a commit's answer."""
    with RestGateway(iceberg_rest.uri, token=REST_TOKEN, credential=REST_CREDENTIAL,
                     warehouses={REST_WAREHOUSE}) as gateway:
        yield gateway


@pytest.fixture(scope="session")
def pg_data_root() -> Path:
    """Where test PostgreSQL servers keep their data: NOT under pytest's basetemp.

    As root the server runs as `postgres`, which must traverse every parent folder; any
    pytest session that starts (another developer's, in parallel) resets
    /tmp/pytest-of-root to mode 0700, after which a server there can no longer (re)start.
    """
    root = Path(tempfile.mkdtemp(prefix="aeo-test-pg-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres(pg_data_root) -> LocalPostgres:
    """A throwaway PostgreSQL (Debian's binaries, 2PC on) with the database PG_DATABASE."""
    server = LocalPostgres(pg_data_root / "session", max_prepared_transactions=32)
    server.start()
    server.create_database(PG_DATABASE)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def airflow_database(pg_data_root) -> LocalPostgres:
    """Airflow's metadata database: PostgreSQL on a server of its own (devtools.airflow_stack.metadata_server).

    Not the `postgres` server: tests crash that one (stop -m immediate) under a running stack.
    """
    server = metadata_server(pg_data_root / "airflow-metadata")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_broker(tmp_path_factory) -> LocalRedis:
    """Redis (Debian's redis-server, append-only file synced on every write): Celery's broker."""
    server = LocalRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def no_stale_spark_connect_mark():
    """A test that wrote through Spark Connect in this process leaves pyspark's Connect mark set (pyspark never
    clears it), and every later classic DataFrame call of the worker would take Connect's path (mapInArrow: "No
    active or default Spark session"): each test starts without it, as each Airflow task does."""
    drop_stale_connect_mode()
    yield


@pytest.fixture(scope="session")
def spark_connect(tmp_path_factory) -> LocalSparkConnectServer:
    """A Spark Connect server (local[2]) with Spark's Kafka connector and Iceberg: the warm Spark of write tasks."""
    server = LocalSparkConnectServer(tmp_path_factory.mktemp("spark-connect"), with_iceberg=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def faults_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="session")
def example_output(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("example") / "kafka_to_parquet"


@pytest.fixture(scope="session")
def example_spark_output(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("example") / "kafka_to_parquet_on_spark"


def _secured_connections(request) -> dict[str, str]:
    """AIRFLOW_CONN_* of the secured broker, when a test of the session uses it (else it is not started)."""
    if not any("secured_kafka" in getattr(item, "fixturenames", ()) for item in request.session.items):
        return {}
    broker = request.getfixturevalue("secured_kafka")

    def connection(password: str | None = None) -> str:
        return json.dumps({"conn_type": "kafka", "extra": broker.connection_extra(PIPELINE_USER, password)})

    return {f"AIRFLOW_CONN_{SECURED_CONN_ID.upper()}": connection(),
            f"AIRFLOW_CONN_{SECURED_BAD_PASSWORD_CONN_ID.upper()}": connection("not-the-password")}


@pytest.fixture(scope="session")
def example_lakehouse(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("example") / "lakehouse"


def example_delta_table(example_lakehouse: Path) -> Path:
    """dags/kafka_to_delta.py's table, beside the Iceberg example's warehouse."""
    return example_lakehouse.parent / "delta" / "events"


@pytest.fixture(scope="session")
def arrival_output(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("example") / "arrivals"


@pytest.fixture(scope="session")
def unreachable() -> dict[str, str]:
    """A broker and a ledger that never answer (ports reserved by this session, never listened on)."""
    from devtools.ports import reserve_port

    return {"kafka": f"127.0.0.1:{reserve_port()}",
            "ledger": f"postgresql+psycopg2://postgres@127.0.0.1:{reserve_port()}/ledger"}


@pytest.fixture(scope="session")
def hang_up_ledger():
    """A ledger URL whose server hangs up on every connection; the listener counts the attempts."""
    from tests.helpers import HangUpListener

    listener = HangUpListener()
    yield listener, f"postgresql+psycopg2://postgres@127.0.0.1:{listener.port}/ledger"
    listener.close()


@pytest.fixture(scope="session")
def statsd():
    """StatsD servers the session's Airflow sends its metrics to, keeping this provider's (`exactly_once.`): the
    tasks' to `tasks`, the triggerer's to `triggerer`, so a test can tell who sent a value."""
    from tests.helpers import StatsdListener

    listeners = SimpleNamespace(tasks=StatsdListener(keep="airflow.exactly_once"),
                                triggerer=StatsdListener(keep="airflow.exactly_once"))
    yield listeners
    listeners.tasks.close()
    listeners.triggerer.close()


def statsd_env(port: int) -> dict[str, str]:
    """Metrics through Airflow's StatsD logger to a listener of the session (tests/system/test_metrics_airflow.py),
    for the components that send this provider's: the scheduler (its tasks) and the triggerer; the api-server and
    the dag-processor keep metrics off. Only this provider's metrics: the allow list keeps Airflow's own from being
    sent at all. InfluxDB-style tags put the tags in the names, so that the listener sees them too."""
    return {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(port), "AIRFLOW__METRICS__METRICS_ALLOW_LIST": "exactly_once",
            "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True"}


@pytest.fixture(scope="session")
def openlineage_events(tmp_path_factory) -> Path:
    """The file the session's Airflow writes its OpenLineage events to (one JSON event per line)."""
    return tmp_path_factory.mktemp("openlineage") / "events.jsonl"


def openlineage_env(events: Path) -> dict[str, str]:
    """OpenLineage on, for the DAGs that call `enable_lineage` only (selective_enable), to a file: the DAGs of
    tests/dags/eo_lineage_test_dag.py and eo_no_secret_test_dag.py; every other task's listener returns at once."""
    return {"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(events),
                                                           "append": True}),
            "AIRFLOW__OPENLINEAGE__SELECTIVE_ENABLE": "True", "AIRFLOW__OPENLINEAGE__NAMESPACE": "eo-tests"}


@pytest.fixture(scope="session")
def airflow(request, kafka, postgres, airflow_database, faults_dir, example_output, example_spark_output, example_lakehouse,
            arrival_output, unreachable, hang_up_ledger, statsd, openlineage_events, tmp_path_factory):
    """The session's Airflow: api-server, scheduler, dag-processor and triggerer (Asset watchers)."""
    from tests.helpers import create_topic

    # The backlog triggers of the event-driven example and of the metrics test start polling as soon as the
    # stack runs.
    create_topic(kafka.bootstrap_servers, ARRIVAL_TOPIC, partitions=3)
    create_topic(kafka.bootstrap_servers, METRICS_PIPELINE, partitions=3)
    root = tmp_path_factory.mktemp("airflow")
    dag_files = sorted((REPO / "dags").glob("*.py")) + sorted((REPO / "tests" / "dags").glob("*.py"))
    env = {
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
            {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka.bootstrap_servers}}),
        FAULTS_ENV: str(faults_dir),
        "EXACTLY_ONCE_DEMO_TOPIC": EXAMPLE_TOPIC,
        "EXACTLY_ONCE_DEMO_OUTPUT": str(example_output),
        "EXACTLY_ONCE_DEMO_MAX_RECORDS": "150",
        "EXACTLY_ONCE_SPARK_DEMO_TOPIC": SPARK_EXAMPLE_TOPIC,
        "EXACTLY_ONCE_SPARK_DEMO_OUTPUT": str(example_spark_output),
        "EXACTLY_ONCE_DEMO_K2K_INPUT": K2K_INPUT,
        "EXACTLY_ONCE_DEMO_K2K_OUTPUT": K2K_OUTPUT,
        "PYTHONPATH": os.pathsep.join([str(root / "dags"), str(REPO), os.environ.get("PYTHONPATH", "")]),
        "EO_TEST_SLOW_SECONDS": "15",
        # The official postgres connection type; no password (trust on 127.0.0.1).
        f"AIRFLOW_CONN_{PG_CONN_ID.upper()}": json.dumps(
            {"conn_type": "postgres", "host": "127.0.0.1", "port": postgres.port, "login": "postgres",
             "schema": PG_DATABASE}),
        "EXACTLY_ONCE_DEMO_POSTGRES_CONN": PG_CONN_ID,
        "EXACTLY_ONCE_DEMO_PG_TOPIC": PG_EXAMPLE_TOPIC,
        "EXACTLY_ONCE_DEMO_ICEBERG_TOPIC": ICEBERG_EXAMPLE_TOPIC,
        "EXACTLY_ONCE_DEMO_ICEBERG_WAREHOUSE": str(example_lakehouse),
        "EXACTLY_ONCE_DEMO_DELTA_TOPIC": DELTA_EXAMPLE_TOPIC,
        "EXACTLY_ONCE_DEMO_DELTA_PATH": str(example_delta_table(example_lakehouse)),
        "EXACTLY_ONCE_DEMO_DELTA_SPARK_CONN_ID": SPARK_CONN_ID,  # the warm server (the `warm_spark` fixture)
        "EXACTLY_ONCE_DEMO_REGISTRY_TOPIC": REGISTRY_EXAMPLE_TOPIC,
        "EXACTLY_ONCE_DEMO_REGISTRY_OUTPUT": str(example_lakehouse.parent / "orders_avro"),
        # its write runs on the session's warm Spark Connect server (the `warm_spark` connection)
        "EXACTLY_ONCE_DEMO_REGISTRY_SPARK_CONN_ID": SPARK_CONN_ID,
        # so does the Kafka example's (its sink runs the same code in the executors either way); the Parquet,
        # PostgreSQL, Iceberg (its catalog and jars set up by the task's driver) and cluster examples keep the
        # in-task driver, the default path
        "EXACTLY_ONCE_DEMO_K2K_SPARK_CONN_ID": SPARK_CONN_ID,
        **_secured_connections(request),
        "EXACTLY_ONCE_ARRIVAL_TOPIC": ARRIVAL_TOPIC,
        "EXACTLY_ONCE_ARRIVAL_OUTPUT": str(arrival_output),
        "EXACTLY_ONCE_ARRIVAL_MIN_RECORDS": str(ARRIVAL_MIN_RECORDS),
        "EXACTLY_ONCE_ARRIVAL_MAX_WAIT_SECONDS": "3600",  # by count only here: the idle check stays quiet
        "EXACTLY_ONCE_ARRIVAL_POLL_SECONDS": str(ARRIVAL_POLL_SECONDS),
        "EXACTLY_ONCE_ARRIVAL_SPARK_CONN_ID": SPARK_CONN_ID,  # the warm server, like the registry example
        # tests/dags/eo_backlog_unreachable_dag.py: watchers of a broker and a ledger that never answer
        "EO_UNREACHABLE_KAFKA": unreachable["kafka"],
        "EO_UNREACHABLE_LEDGER": hang_up_ledger[1],
        **no_secret_env(NO_SECRET_MARKERS, postgres.port, PG_DATABASE),  # tests/dags/eo_no_secret_test_dag.py
        "EO_METRICS_PIPELINE": METRICS_PIPELINE,
        "EO_METRICS_SPARK_CONN_ID": SPARK_CONN_ID,  # the warm server (the `warm_spark` fixture creates it)
        **openlineage_env(openlineage_events),
    }
    # The DAG files never change during a session: parsed once, not every 30 s. Parsing the ~20 files again and
    # again took a third of a core per stack (measured: 320 s of CPU in 940 s of a run).
    stack = AirflowStack(
        root, dag_files, env, triggerer=True, reparse_seconds=3600,
        database_url=airflow_database.url(AIRFLOW_DATABASE),
        component_env={
            "scheduler": statsd_env(statsd.tasks.port),  # LocalExecutor: the tasks run in the scheduler's children
            "triggerer": statsd_env(statsd.triggerer.port)})
    stack.start()
    yield stack
    stack.stop()


@pytest.fixture
def faults(faults_dir):
    """Arms crash points for one test and disarms whatever is left afterwards."""
    yield faults_dir
    for path in faults_dir.iterdir():
        path.unlink() if path.is_file() else shutil.rmtree(path)


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def spark():
    """The session's one local[2] SparkSession with the Kafka connector (see SPARK_CONF_DIR above).

    One for every tier: a second `build_spark_session` in the same process returns this same session
    (getOrCreate), so a test that stopped "its own" would end the JVM under every later user.
    """
    from airflow_exactly_once.spark.in_process_session import build_spark_session, stop_spark

    session = build_spark_session("tests", {"spark.master": "local[2]"})
    yield session
    stop_spark(session)
