"""A real Confluent-compatible Schema Registry on 127.0.0.1, with authentication on, for tests and the demo.

It is Apicurio Registry (devtools/registry/pom.xml says which release and why), built once from its
Maven Central jars into a Quarkus fast-jar in the cache folder (`python -m devtools build-registry`,
run by `make setup`), and started with the machine's Java. Clients speak Confluent's REST API at
`<base>/apis/ccompat/v7` (confluent-kafka's SchemaRegistryClient, Spark's from_avro with a registry).

* Authentication: HTTP basic auth against Quarkus' embedded users (the registry's user and any `users=`
  given), or a bearer token: an RS256 JWT that Quarkus' OIDC extension verifies against the public key of a
  signing key made here (no OIDC server; `bearer_token()` mints one, the private key never leaves the data
  folder). Every path needs one of them: a request without, with a wrong password, or with a token that is
  expired, signed by another key or of another issuer gets 401.
* TLS (tls=True): an HTTPS listener beside the HTTP one that requires a client certificate signed by the
  registry's own CA (devtools.tls makes both), as the secured broker does.
* Storage: an H2 database file in the data folder, so `stop()` (or `kill()`) then `start()` (same port)
  keeps every schema and its id; persistent=False keeps them in memory (a restart forgets them).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from devtools.maven import built_once, devenv_home
from devtools.ports import reserve_port
from devtools.processes import LocalServer, stop_session

SOURCE = Path(__file__).resolve().parent / "registry"  # the Maven project that builds the registry
CCOMPAT_PATH = "/apis/ccompat/v7"  # Confluent's API, as Apicurio serves it
HEAP = "384m"
TOKEN_ISSUER = "airflow-exactly-once-devtools"  # the `iss` the registry requires of a bearer token


def apicurio_version() -> str:
    """The Apicurio Registry release devtools/registry/pom.xml builds."""
    found = re.search(r"<apicurio\.version>([^<]+)</apicurio\.version>", (SOURCE / "pom.xml").read_text())
    if found is None:
        raise RuntimeError(f"{SOURCE / 'pom.xml'} names no <apicurio.version>")
    return found.group(1)


def _source_digest() -> str:
    """A digest of the Maven project: a changed pom or class builds a new registry folder."""
    digest = hashlib.sha256()
    for path in sorted(p for p in SOURCE.rglob("*") if p.is_file() and "target" not in p.relative_to(SOURCE).parts):
        digest.update(str(path.relative_to(SOURCE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def registry_app() -> Path:
    """The built registry's quarkus-app folder (quarkus-run.jar and its lib/), built once per machine and
    project version into the cache folder (devtools.maven.built_once)."""
    def package(work: Path) -> Path:
        project = work / "project"
        shutil.copytree(SOURCE, project, ignore=shutil.ignore_patterns("target"))
        result = subprocess.run(["mvn", "-B", "-q", "package"], cwd=project, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"Maven could not build the Schema Registry (Apicurio {apicurio_version()}) "
                               f"from {SOURCE}:\n{result.stdout[-4000:]}{result.stderr[-2000:]}")
        staging = work / "built"
        staging.mkdir()
        os.rename(project / "target" / "quarkus-app", staging / "quarkus-app")
        return staging

    target = devenv_home() / "schema-registry" / f"apicurio-{apicurio_version()}-{_source_digest()}"
    return built_once(target, ".build.lock", package) / "quarkus-app"


def _new_signing_key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed_jwt(private_key: Any, claims: dict[str, Any]) -> str:
    """An RS256 JSON Web Token (RFC 7519) of `claims`, signed with an RSA private key (cryptography's)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    signing_input = (_b64url(json.dumps({"alg": "RS256", "typ": "JWT"}, separators=(",", ":")).encode()) + "."
                     + _b64url(json.dumps(claims, separators=(",", ":")).encode()))
    signature = private_key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + _b64url(signature)


def _properties(values: dict[str, str]) -> str:
    """A Java properties file; values escaped as java.util.Properties reads them."""
    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")

    return "".join(f"{key}={escape(value)}\n" for key, value in values.items())


class LocalSchemaRegistry(LocalServer):
    """Start, stop and restart one registry whose files (config, H2 database, log, TLS) live in `data_dir`."""

    def __init__(self, data_dir: str | Path, port: int = 0, user: str = "registry",
                 password: str = "registry-secret", tls: bool = False, persistent: bool = True,
                 heap: str = HEAP, users: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.port = port or reserve_port()
        self.tls = tls
        self.tls_port = reserve_port() if tls else None
        self.user = user
        self.password = password
        self.users = {**(users or {}), user: password}  # login -> password; every one may read and write
        self.persistent = persistent
        self.heap = heap
        self.process: subprocess.Popen | None = None
        self.startup_seconds: float | None = None  # of the last start, until the API answered

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The Confluent-compatible API: what SchemaRegistryClient's `url` takes."""
        return self.base_url + CCOMPAT_PATH

    @property
    def https_url(self) -> str:
        if not self.tls:
            raise RuntimeError("this registry was started without tls=True: it has no HTTPS listener")
        return f"https://127.0.0.1:{self.tls_port}{CCOMPAT_PATH}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "registry.log"

    @property
    def tls_dir(self) -> Path:
        return self.data_dir / "tls"

    def client_config(self, password: str | None = None) -> dict[str, Any]:
        """confluent-kafka SchemaRegistryClient settings of the registry's user (another password if given)."""
        return {"url": self.url, "basic.auth.user.info": f"{self.user}:{password or self.password}"}

    def tls_client_config(self, with_certificate: bool = True) -> dict[str, Any]:
        """SchemaRegistryClient settings for the HTTPS listener: the CA, and the client's certificate if asked."""
        config = {"url": self.https_url, "basic.auth.user.info": f"{self.user}:{self.password}",
                  "ssl.ca.location": str(self.tls_dir / "ca.pem")}
        if with_certificate:
            config.update({"ssl.certificate.location": str(self.tls_dir / "client.pem"),
                           "ssl.key.location": str(self.tls_dir / "client-key.pem")})
        return config

    def bearer_client_config(self, token: str) -> dict[str, Any]:
        """SchemaRegistryClient settings that present `token` as a bearer token (no basic auth)."""
        return {"url": self.url, "bearer.auth.credentials.source": "STATIC_TOKEN", "bearer.auth.token": token,
                "bearer.auth.logical.cluster": "default"}

    @property
    def _signing_key_file(self) -> Path:
        return self.data_dir / "jwt" / "signing-key.pem"

    def _signing_key(self) -> Any:
        """The key bearer tokens are signed with: made on first use, kept across restarts (tokens stay valid)."""
        from cryptography.hazmat.primitives import serialization

        if not self._signing_key_file.exists():
            self._signing_key_file.parent.mkdir(parents=True, exist_ok=True)
            pem = _new_signing_key().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption())
            self._signing_key_file.touch(mode=0o600)
            self._signing_key_file.write_bytes(pem)
        return serialization.load_pem_private_key(self._signing_key_file.read_bytes(), password=None)

    def bearer_token(self, subject: str = "registry-client", expires_in: float = 3600.0,
                     foreign_key: bool = False, issuer: str = TOKEN_ISSUER) -> str:
        """A JWT the registry accepts as `Authorization: Bearer`; expires_in <= 0 gives an expired one,
        foreign_key=True one signed by a key the registry does not know, another issuer one it refuses."""
        now = int(time.time())
        expires = now + int(expires_in)
        claims = {"iss": issuer, "sub": subject, "upn": subject, "iat": min(now, expires - 60), "exp": expires}
        return signed_jwt(_new_signing_key() if foreign_key else self._signing_key(), claims)

    def _jwt_config(self) -> dict[str, str]:
        """Quarkus OIDC as a bearer-token verifier with a local public key: no OIDC server is asked."""
        from cryptography.hazmat.primitives import serialization

        public = self._signing_key().public_key().public_bytes(serialization.Encoding.DER,
                                                               serialization.PublicFormat.SubjectPublicKeyInfo)
        return {
            "quarkus.oidc.tenant-enabled": "true",
            "quarkus.oidc.application-type": "service",
            "quarkus.oidc.public-key": base64.b64encode(public).decode(),
            "quarkus.oidc.token.issuer": TOKEN_ISSUER,
        }

    def _make_tls(self) -> dict[str, str]:
        """CA, server and client certificates (kept across restarts) and the settings of the HTTPS listener."""
        from devtools.tls import make_ca, make_server_certificate

        trust_store, store_password = self.tls_dir / "trust.p12", "registry-trust"
        if not trust_store.exists():
            ca = make_ca(self.tls_dir, common_name="airflow-exactly-once registry test CA")
            make_server_certificate(ca, self.tls_dir, name="server")
            make_server_certificate(ca, self.tls_dir, name="client", hosts=("registry-client",))
            keytool = Path(os.path.realpath(shutil.which("java") or "java")).parent / "keytool"
            result = subprocess.run([str(keytool), "-importcert", "-noprompt", "-alias", "ca", "-file", str(ca.certificate),
                                     "-keystore", str(trust_store), "-storetype", "PKCS12", "-storepass", store_password],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"keytool could not write the registry's trust store:\n{result.stdout}{result.stderr}")
        return {
            "quarkus.http.ssl-port": str(self.tls_port),
            "quarkus.http.ssl.certificate.files": str(self.tls_dir / "server.pem"),
            "quarkus.http.ssl.certificate.key-files": str(self.tls_dir / "server-key.pem"),
            "quarkus.http.ssl.certificate.trust-store-file": str(trust_store),
            "quarkus.http.ssl.certificate.trust-store-file-type": "PKCS12",
            "quarkus.http.ssl.certificate.trust-store-password": store_password,
        }

    def _config(self) -> dict[str, str]:
        # WRITE_DELAY=0: each commit reaches the file before the answer, so even a SIGKILL (kill()) loses no
        # registered schema (H2's default delay of up to a second lost the last one).
        database = (f"jdbc:h2:file:{self.data_dir / 'h2' / 'registry'};WRITE_DELAY=0" if self.persistent
                    else "jdbc:h2:mem:registry_db")
        config = {
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": str(self.port),
            "quarkus.datasource.jdbc.url": database,
            # Apicurio's production pool keeps 20 connections open; two serve a test.
            "quarkus.datasource.jdbc.min-size": "1",
            "quarkus.datasource.jdbc.initial-size": "1",
            "quarkus.datasource.jdbc.max-size": "10",
            "quarkus.http.insecure-requests": "enabled",
            **self._jwt_config(),
        }
        for login, password in self.users.items():
            config["quarkus.security.users.embedded.users." + login] = password
            config["quarkus.security.users.embedded.roles." + login] = "sr-admin"
        if self.tls:
            config.update(self._make_tls())
        return config

    def start(self, timeout: float = 90.0) -> "LocalSchemaRegistry":
        app = registry_app()
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("Java is not installed; run `make setup` (it installs OpenJDK 17).")
        (self.data_dir / "config").mkdir(parents=True, exist_ok=True)
        config_file = self.data_dir / "config" / "application.properties"  # Quarkus reads it from its cwd
        config_file.write_text(_properties(self._config()))
        config_file.chmod(0o600)  # the passwords
        log = open(self.log_file, "ab")
        began = time.monotonic()
        self.process = subprocess.Popen(
            [java, f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-jar",
             str(app / "quarkus-run.jar")],
            cwd=self.data_dir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        (self.data_dir / "registry.pid").write_text(str(self.process.pid))
        deadline = began + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Schema Registry exited with code {self.process.returncode}; see "
                                   f"{self.log_file}:\n{self.log_file.read_text(errors='replace')[-3000:]}")
            if self._ready():
                self.startup_seconds = time.monotonic() - began
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the Schema Registry did not answer on {self.base_url} within {timeout:.0f}s; see "
                           f"{self.log_file}:\n{self.log_file.read_text(errors='replace')[-3000:]}")

    def _ready(self) -> bool:
        credentials = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request = urllib.request.Request(self.url + "/subjects", headers={"Authorization": f"Basic {credentials}"})
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return response.status == 200
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                self.stop()
                raise RuntimeError(f"the Schema Registry on {self.base_url} refused its own user {self.user!r} (401): "
                                   f"its embedded users are not configured; see {self.data_dir / 'config'}") from None
            return False
        except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
            return False

    def rss_bytes(self) -> int:
        """Resident memory of the running registry's JVM."""
        if self.process is None:
            raise RuntimeError("the Schema Registry is not running")
        return psutil.Process(self.process.pid).memory_info().rss

    def stop(self, timeout: float = 30.0) -> None:
        if self.process is not None:
            stop_session(self.process, timeout)
            self.process = None
