"""A real Iceberg REST catalog server on 127.0.0.1 for tests, the benchmarks and the demo: Iceberg's own.

It is `org.apache.iceberg:iceberg-open-api` (REST_SERVER below): the reference server of the REST
catalog specification, one self-contained jar on Maven Central (212 MB; fetched once into the jar
cache by `python -m devtools fetch-jars`, as the broker's jars are), started with `java -jar` and
configured by `CATALOG_*` environment variables (RCKUtils.environmentCatalogConfig: `CATALOG_URI` is
the catalog property `uri`, `CATALOG_JDBC_USER` is `jdbc.user`, `CATALOG_REST_PORT` is `rest.port`).

Behind the REST API it keeps Iceberg's JdbcCatalog on an SQLite file in the data folder, so `stop()`
or `kill()` then `start()` (same port) keeps every table; the warehouse is a local folder beside it
(`warehouse`), and further catalog properties pass through `properties`: a warehouse on object storage is
`properties=storage.iceberg_properties("s3://bucket/prefix")` (devtools.object_storage) with
`env=SDK_CHECKSUM_ENV`; the server's jar carries Iceberg's S3FileIO and the AWS SDK. It checks no credential: tests that need a catalog that refuses one put
devtools.rest_gateway in front of it, as a platform puts an API gateway.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from devtools.maven import Artifact, fetch_jars
from devtools.ports import reserve_port
from devtools.processes import LocalServer, wait_ready

REST_SERVER = Artifact("org.apache.iceberg", "iceberg-open-api", "1.10.1", transitive=False)
HEAP = "256m"


def rest_server_jar() -> Path:
    """The server's jar in the shared jar cache (fetched with Maven on first use)."""
    folder = fetch_jars("iceberg-rest-server", (REST_SERVER,))
    return folder / f"{REST_SERVER.name}-{REST_SERVER.version}.jar"


def catalog_environment(properties: dict[str, str]) -> dict[str, str]:
    """Catalog properties as the server reads them from its environment: `-` is `__`, `.` is `_`, upper case."""
    return {"CATALOG_" + key.replace("-", "__").replace(".", "_").upper(): value for key, value in properties.items()}


class LocalIcebergRestCatalog(LocalServer):
    """One REST catalog server whose catalog database, warehouse and log live in `data_dir`, on a port kept
    across restarts."""

    def __init__(self, data_dir: str | Path, port: int = 0, properties: dict[str, str] | None = None,
                 heap: str = HEAP, env: dict[str, str] | None = None) -> None:
        self.startup_seconds: float | None = None  # of the last start, until the API answered
        self.data_dir = Path(data_dir).absolute()
        self.port = port or reserve_port()
        self.properties = dict(properties or {})
        self.heap = heap
        self.env = dict(env or {})  # e.g. the AWS SDK's settings for a warehouse on an S3-compatible server

    @property
    def uri(self) -> str:
        """The catalog's base URL, what the sink's catalog `uri` takes."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def warehouse(self) -> Path:
        """Where the server puts a new table's files: `<warehouse>/<namespace>/<table>`."""
        return self.data_dir / "warehouse"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "rest-catalog.log"

    def catalog_properties(self) -> dict[str, str]:
        return {"uri": f"jdbc:sqlite:{self.data_dir / 'catalog.sqlite'}", "warehouse": str(self.warehouse),
                "rest.port": str(self.port), **self.properties}

    def start(self, timeout: float = 60.0) -> "LocalIcebergRestCatalog":
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("Java is not installed; run `make setup` (it installs OpenJDK 17).")
        jar = rest_server_jar()
        self.warehouse.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CATALOG_")}
        env.update({**self.env, **catalog_environment(self.catalog_properties())})
        began = time.monotonic()
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                [java, f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-jar", str(jar)],
                cwd=self.data_dir, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        if wait_ready(self.ready, self.process, timeout):
            self.startup_seconds = time.monotonic() - began
            return self
        failed = self.process.poll()
        self.stop()
        tail = self.log_file.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the Iceberg REST catalog {'exited with code ' + str(failed) if failed is not None else 'did not answer'} "
                           f"on {self.uri} (within {timeout:.0f}s); see {self.log_file}:\n{tail}")

    def ready(self) -> bool:
        """Whether the server answers its configuration endpoint."""
        try:
            with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=2) as response:
                return response.status == 200 and "defaults" in json.loads(response.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            return False

    def __repr__(self) -> str:
        return f"LocalIcebergRestCatalog({self.uri}, {self.data_dir})"
