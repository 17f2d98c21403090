"""A real single-node Apache Kafka broker (KRaft) on 127.0.0.1, for tests and the demo.

It runs the broker from its Maven Central jars with the machine's Java, with
transactions enabled for a single node. Nothing here is a mock: it is the same
`kafka.Kafka` main class that `kafka-server-start.sh` runs. The Kafka release is
devtools.maven.kafka_version() (AIRFLOW_EXACTLY_ONCE_KAFKA_VERSION, default 3.9.1);
devtools.kafka_secured adds a SASL_SSL listener, SCRAM users and ACLs.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from devtools.maven import kafka_broker_jars, kafka_major, kafka_version
from devtools.ports import reserve_port
from devtools.processes import LocalServer

# Kafka 3.x logs through reload4j (log4j 1 syntax), Kafka 4.x through log4j2.
_LOG4J1 = (
    "log4j.rootLogger=WARN, stdout\n"
    "log4j.logger.kafka=INFO\nlog4j.logger.org.apache.kafka=INFO\n"
    "log4j.appender.stdout=org.apache.log4j.ConsoleAppender\n"
    "log4j.appender.stdout.layout=org.apache.log4j.PatternLayout\n"
    "log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n\n"
)
_LOG4J2 = (
    "status = warn\n"
    "appender.stdout.type = Console\nappender.stdout.name = STDOUT\n"
    "appender.stdout.layout.type = PatternLayout\nappender.stdout.layout.pattern = [%d] %p %m (%c)%n\n"
    "rootLogger.level = WARN\nrootLogger.appenderRef.stdout.ref = STDOUT\n"
    "logger.kafka.name = kafka\nlogger.kafka.level = INFO\n"
    "logger.apache.name = org.apache.kafka\nlogger.apache.level = INFO\n"
)


class LocalKafkaBroker(LocalServer):
    """Start, stop and restart one broker whose data lives in `data_dir`."""

    # The JVM's heap; the nodes of devtools.kafka_cluster take less (three of them share the machine).
    heap_options: tuple[str, ...] = ("-Xms256m", "-Xmx768m")

    def __init__(
        self,
        data_dir: str | Path,
        port: int = 0,
        controller_port: int = 0,
        transaction_max_timeout_ms: int = 900_000,
        extra_config: dict[str, str] | None = None,
        version: str | None = None,
        heap_options: tuple[str, ...] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        if heap_options is not None:
            self.heap_options = heap_options
        self.version = version or kafka_version()
        self.port = port or reserve_port()
        self.controller_port = controller_port or reserve_port()
        self.transaction_max_timeout_ms = transaction_max_timeout_ms
        self.extra_config = extra_config or {}
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    def client_config(self) -> dict[str, Any]:
        """kafka-python keyword arguments of a client with every right (the secured broker adds its admin login)."""
        return {"bootstrap_servers": self.bootstrap_servers}

    def _listener_config(self) -> dict[str, str]:
        return {
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        }

    def _format_arguments(self) -> list[str]:
        """Extra `kafka-storage format` arguments (the secured broker's SCRAM users)."""
        return []

    def _storage_cluster_id(self) -> str:
        """The KRaft cluster id the storage is formatted with: a new one; the nodes of a cluster share theirs."""
        return cluster_id()

    def _config(self) -> dict[str, str]:
        config = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            **self._listener_config(),
            "log.dirs": str(self.data_dir / "logs"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "3",
            "transaction.max.timeout.ms": str(self.transaction_max_timeout_ms),
            # Expired transactions are aborted within seconds, so timeout tests stay short.
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "delete.topic.enable": "true",
            "log.retention.check.interval.ms": "1000",
        }
        config.update(self.extra_config)
        return config

    def _java(self, main_class: str, *args: str, **popen) -> subprocess.Popen:
        jars = kafka_broker_jars(self.version)
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("Java is not installed; run `make setup` (it installs OpenJDK 17).")
        if kafka_major(self.version) >= 4:
            logging_config = self.data_dir / "log4j2.properties"
            logging_config.write_text(_LOG4J2)
            logging_option = f"-Dlog4j2.configurationFile={logging_config}"
        else:
            logging_config = self.data_dir / "log4j.properties"
            logging_config.write_text(_LOG4J1)
            logging_option = f"-Dlog4j.configuration=file:{logging_config}"
        cmd = [java, *self.heap_options, "-XX:+UseG1GC", logging_option, "-cp", f"{jars}/*", main_class, *args]
        return subprocess.Popen(cmd, **popen)

    def start(self, timeout: float = 90.0) -> "LocalKafkaBroker":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        properties = self.data_dir / "server.properties"
        properties.write_text("".join(f"{k}={v}\n" for k, v in self._config().items()))
        if not (self.data_dir / "logs" / "meta.properties").exists():
            fmt = self._java("kafka.tools.StorageTool", *format_arguments(properties, self._storage_cluster_id()),
                             *self._format_arguments(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            out, _ = fmt.communicate(timeout=120)
            if fmt.returncode != 0:
                raise RuntimeError(f"Formatting the Kafka storage failed:\n{out}")
        log = open(self.log_file, "ab")
        self.process = self._java("kafka.Kafka", str(properties), stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        (self.data_dir / "broker.pid").write_text(str(self.process.pid))
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        from kafka import KafkaAdminClient

        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"The Kafka broker exited with code {self.process.returncode}; see {self.log_file}:\n"
                    + self.log_file.read_text(errors="replace")[-3000:]
                )
            try:
                admin = KafkaAdminClient(**self.client_config(), request_timeout_ms=3000)
                try:
                    admin.describe_cluster()
                finally:
                    admin.close()
                return
            except Exception as exc:  # broker still starting
                last_error = exc
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"The Kafka broker did not become ready in {timeout:.0f}s ({last_error}); see {self.log_file}")

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, base64url without padding (22 characters).

    Drawn again while it begins with '-', which the storage tool would read as an option
    (one draw in 64); Kafka's own `Uuid.randomUuid()` does the same.
    """
    while True:
        drawn = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not drawn.startswith("-"):
            return drawn


def format_arguments(properties: Path, cluster: str) -> list[str]:
    """`kafka-storage format` arguments; the id is attached with '=' so it is never taken for an option."""
    return ["format", f"--cluster-id={cluster}", "--config", str(properties)]


def stop_pidfile(data_dir: str | Path) -> bool:
    """Stop a broker started by `python -m devtools kafka start`."""
    pidfile = Path(data_dir) / "broker.pid"
    if not pidfile.exists():
        return False
    pid = int(pidfile.read_text())
    try:
        os.kill(pid, signal.SIGTERM)
        for _ in range(60):
            os.kill(pid, 0)
            time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    pidfile.unlink(missing_ok=True)
    return True
