"""A real Spark Connect server on 127.0.0.1, from the jars in the pyspark package, for tests, the demo and
the benchmarks.

It is the class `sbin/start-connect-server.sh` runs (SparkConnectServer), started with
spark-submit in local mode, with Spark's Kafka connector and this interpreter for its Python
workers (they run the sinks' partition writers, which import kafka-python, confluent-kafka,
psycopg2). Write tasks then connect to `sc://127.0.0.1:<port>` instead of starting a driver.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from airflow_exactly_once.spark.packages import spark_home
from devtools.maven import iceberg_jars, spark_connector_jars
from devtools.ports import reserve_port
from devtools.processes import LocalServer, stop_session

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# An operation whose client went away (a killed write task) is interrupted after this long
# unless a client reattaches; Spark's default is minutes.
DETACHED_TIMEOUT = "20s"


def server_conf(port: int, address: str, local_dir: str, jars: list[str]) -> dict[str, str]:
    """The server's Spark settings (docker/docker-compose.yml's spark-connect service uses them too)."""
    return {
        "spark.connect.grpc.binding.address": address,
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.execute.manager.detachedTimeout": DETACHED_TIMEOUT,
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "8",
        "spark.driver.memory": "1g",
        "spark.sql.session.timeZone": "UTC",
        "spark.local.dir": local_dir,
        **({"spark.jars": ",".join(jars)} if jars else {}),
    }


def server_command(spark_submit: str, cores: int, conf: dict[str, str]) -> list[str]:
    command = [spark_submit, "--class", SERVER_CLASS, "--master", f"local[{cores}]", "--name", "Spark Connect server"]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    return command + ["spark-internal"]


class LocalSparkConnectServer(LocalServer):
    """Start, stop and restart one Spark Connect server whose files live in `data_dir`."""

    def __init__(self, data_dir: str | Path, port: int = 0, cores: int = 2, with_kafka_connector: bool = True,
                 extra_conf: dict[str, str] | None = None, with_iceberg: bool = False) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.port = port or reserve_port()
        self.cores = cores
        self.with_kafka_connector = with_kafka_connector
        self.with_iceberg = with_iceberg  # Iceberg's Spark runtime and catalog drivers too (Iceberg sink writes)
        self.extra_conf = extra_conf or {}
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "spark-connect.log"

    def connection(self) -> dict:
        """An Airflow connection of the Spark provider's `spark_connect` type (AIRFLOW_CONN_* JSON)."""
        return {"conn_type": "spark_connect", "host": "127.0.0.1", "port": self.port}

    def _command(self) -> list[str]:
        jars = ((spark_connector_jars() if self.with_kafka_connector else [])
                + (iceberg_jars() if self.with_iceberg else []))
        conf = server_conf(self.port, "127.0.0.1", str(self.data_dir / "tmp"), jars)
        return server_command(str(spark_home() / "bin" / "spark-submit"), self.cores, {**conf, **self.extra_conf})

    def start(self, timeout: float = 180.0) -> "LocalSparkConnectServer":
        (self.data_dir / "tmp").mkdir(parents=True, exist_ok=True)
        (self.data_dir / "conf").mkdir(exist_ok=True)
        env = dict(os.environ)
        env.update({"SPARK_HOME": str(spark_home()), "SPARK_CONF_DIR": str(self.data_dir / "conf"),
                    "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable})
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        log = open(self.log_file, "ab")
        self.process = subprocess.Popen(self._command(), env=env, cwd=self.data_dir, stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited with code {self.process.returncode}; see "
                                   f"{self.log_file}:\n{self.log_file.read_text(errors='replace')[-3000:]}")
            if self._listening():
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the Spark Connect server did not listen on port {self.port} within {timeout:.0f}s; "
                           f"see {self.log_file}")

    def _listening(self) -> bool:
        with socket.socket() as probe:
            probe.settimeout(1)
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is not None:
            stop_session(self.process, timeout)
            self.process = None
