"""A real S3-compatible server on 127.0.0.1 for tests, the demo and the benchmarks: s3proxy with its filesystem
backend (org.gaul:s3proxy, the self-contained jar from Maven Central, fetched into the jar cache).

Why s3proxy and not Adobe S3Mock 4.7.0 (probed with what the Parquet sink needs, docs/sinks/parquet.md):
both keep a multipart upload open to be completed later, list uploads by prefix and abort them, with
path-style addressing; s3proxy starts in about 2 s with about 130 MB resident and keeps buckets, objects and
open uploads across a restart, where S3Mock took 10-20 s, about 200 MB, and answered ListMultipartUploads with
an error after a restart. Not moto's server: it keeps everything in memory and loses it on a restart.
Its `filesystem` store, not `filesystem-nio2`: the nio2 store lists folders as objects without a size, and Spark's
S3A (the benchmark's baseline, benchmarks/bench_parquet_object_storage.py) fails on them with a NullPointerException;
the `filesystem` store lists a folder as a "folder/" marker of size 0, as S3 lists one a console made. Data lives in
`data_dir`, so `restart` (or `kill` then `start`) comes back with everything. Loopback only,
one key pair; not for production.
"""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

from devtools.maven import Artifact, fetch_jars
from devtools.ports import reserve_port
from devtools.processes import LocalServer, stop_session, wait_ready

S3PROXY = Artifact("org.gaul", "s3proxy", "2.6.0", transitive=False, classifier="jar-with-dependencies")
ACCESS_KEY = "eo-test-access"
SECRET_KEY = "eo-test-secret-key"
REGION = "us-east-1"
# Java's AWS SDK (2.30 and later: Iceberg's S3FileIO in Spark and in the REST catalog server) sends S3's newer
# checksums in aws-chunked uploads, which s3proxy 2.6.0 refuses ("x-amz-content-sha256 does not match"). The SDK's
# own setting to send only the checksums S3 requires, for the environment of every JVM that writes here (boto3's
# client sets the same itself, storage.s3_client). Set by tests/conftest.py before any Spark starts.
SDK_CHECKSUM_ENV = {"AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
                    "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required"}


def s3proxy_jar() -> Path:
    """The self-contained s3proxy jar, fetched once per machine into the jar cache (`make setup` does it)."""
    folder = fetch_jars("s3proxy", (S3PROXY,), strip_version=True)
    return folder / "s3proxy-jar-with-dependencies.jar"


class LocalObjectStorage(LocalServer):
    """One s3proxy whose objects live in `data_dir`, on a reserved port kept across restarts."""

    def __init__(self, data_dir: str | Path, port: int = 0, access_key: str = ACCESS_KEY,
                 secret_key: str = SECRET_KEY) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.port = port or reserve_port()
        self.access_key, self.secret_key = access_key, secret_key

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "s3proxy.log"

    def connection(self) -> dict:
        """The Airflow `aws` connection of this server (as AIRFLOW_CONN_<ID> JSON holds it)."""
        return {"conn_type": "aws", "login": self.access_key, "password": self.secret_key,
                "extra": {"endpoint_url": self.endpoint_url, "region_name": REGION}}

    def client(self, secret_key: str | None = None):
        """A boto3 client of this server (another secret: what a user with a wrong password gets)."""
        from airflow_exactly_once.storage.s3_client import S3Access

        return S3Access(self.endpoint_url, REGION, self.access_key, secret_key or self.secret_key).client()

    def iceberg_properties(self, warehouse: str) -> dict[str, str]:
        """Catalog properties of an Iceberg catalog server whose warehouse (`s3://bucket/prefix`) is here: Iceberg's
        S3FileIO with this server's endpoint and key pair."""
        return {"warehouse": warehouse, "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
                "s3.endpoint": self.endpoint_url, "s3.access-key-id": self.access_key,
                "s3.secret-access-key": self.secret_key, "s3.path-style-access": "true", "client.region": REGION}

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def _properties(self) -> Path:
        blobs = self.data_dir / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "s3proxy.conf"
        conf.write_text("\n".join([
            f"s3proxy.endpoint=http://127.0.0.1:{self.port}", "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={self.access_key}", f"s3proxy.credential={self.secret_key}",
            "jclouds.provider=filesystem", f"jclouds.identity={self.access_key}",
            f"jclouds.credential={self.secret_key}", f"jclouds.filesystem.basedir={blobs}", ""]))
        return conf

    def ready(self) -> bool:
        try:
            self.client().list_buckets()
            return True
        except Exception:  # noqa: BLE001 - not answering yet
            return False

    def start(self, timeout: float = 60.0) -> "LocalObjectStorage":
        command = ["java", "-Xmx256m", "-XX:+UseSerialGC", "-jar", str(s3proxy_jar()), "--properties",
                   str(self._properties())]
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(command, cwd=self.data_dir, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        if wait_ready(self.ready, self.process, timeout):
            return self
        self.stop()
        raise RuntimeError(f"s3proxy did not answer on {self.endpoint_url} within {timeout:.0f}s:\n"
                           f"{self.log_file.read_text(errors='replace')[-3000:]}")

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is not None:
            stop_session(self.process, timeout)
            self.process = None

    def __repr__(self) -> str:
        return f"LocalObjectStorage({self.endpoint_url}, {self.data_dir})"


def committed_rows(client: Any, bucket: str, prefix: str, columns: list[str] | None = None) -> list[dict]:
    """The rows of a Parquet sink's output at s3://bucket/prefix as a reader that wants whole batches reads them: the
    files its `_manifest/` entries list (docs/sinks/parquet.md), nothing else."""
    import pyarrow.parquet as pq

    rows: list[dict] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/_manifest/"):
        for item in page.get("Contents", []):
            for name in json.loads(client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read())["files"]:
                body = client.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read()
                rows += pq.read_table(io.BytesIO(body), columns=columns).to_pylist()
    return rows
