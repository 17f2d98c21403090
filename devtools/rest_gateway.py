"""An HTTP gateway in front of a REST catalog server, for tests: the checks a platform's API gateway makes, and
the faults a network makes.

Iceberg's reference REST server (devtools.iceberg_rest) checks no credential and serves any warehouse; a
platform's catalog sits behind a gateway that does. This one, in a thread of the test process, forwards every
request to the server and:

* authentication (`token=`): a request needs `Authorization: Bearer <token>`, else 401 with Iceberg's error
  body; OAuth2's client-credentials exchange (`POST /v1/oauth/tokens`) is answered here, with the token for
  the client `client_id:client_secret` given as `credential=` and 401 `invalid_client` for any other;
* warehouses (`warehouses=`): `GET /v1/config?warehouse=<w>` for a warehouse not in the set is 404
  (NoSuchWarehouseException), as catalogs that serve named warehouses answer;
* faults on the next table commit (`POST .../namespaces/<ns>/tables/<t>` or `.../transactions/commit`):
  `lose_next_commit_answer(then)` forwards it, waits for the server's answer (the commit is applied),
  runs `then` (e.g. SIGKILL the server) and drops the client's connection unanswered;
  `delay_next_commit_answer(seconds)` holds the applied commit's answer back that long.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Callable
from urllib.parse import parse_qs, urlsplit

from devtools.http_thread import ThreadedHttpServer
from devtools.ports import reserve_port

COMMIT_PATH = re.compile(r"^/v1/(?:.+/)?(?:namespaces/[^/]+/tables/[^/]+|transactions/commit)$")
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
                "proxy-authenticate", "content-length", "host"}


def is_commit(method: str, path: str) -> bool:
    """Whether a request commits changes to a table (the requests whose answer may be lost)."""
    return method == "POST" and COMMIT_PATH.match(urlsplit(path).path) is not None


def error_body(code: int, kind: str, message: str) -> bytes:
    """Iceberg's REST error model."""
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()


@dataclass
class Fault:
    """What happens to the next commit's answer: lost (after `then` ran) or delayed."""

    lose: bool = False
    delay_seconds: float = 0.0
    then: Callable[[], None] | None = None


class RestGateway(ThreadedHttpServer):
    """A gateway on its own port in front of `upstream` (http://host:port)."""

    def __init__(self, upstream: str, token: str | None = None, credential: str | None = None,
                 warehouses: set[str] | None = None, port: int = 0) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.token = token
        self.credential = credential
        self.warehouses = warehouses
        self.port = port or reserve_port()
        self.commits_seen = 0
        self._fault: Fault | None = None
        self._lock = threading.Lock()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- faults --------------------------------------------------------------------

    def lose_next_commit_answer(self, then: Callable[[], None] | None = None) -> None:
        with self._lock:
            self._fault = Fault(lose=True, then=then)

    def delay_next_commit_answer(self, seconds: float) -> None:
        with self._lock:
            self._fault = Fault(delay_seconds=seconds)

    def _take_fault(self) -> Fault | None:
        with self._lock:
            fault, self._fault = self._fault, None
            return fault

    # -- serving -------------------------------------------------------------------

    thread_name = "rest-gateway"

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args) -> None:  # quiet: tests read the answers
                pass

            def do_GET(self) -> None:
                gateway._handle(self)

            do_POST = do_DELETE = do_HEAD = do_PUT = do_GET

        return Handler

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("Content-Length") or 0))
        path = urlsplit(request.path)
        if path.path.endswith("/oauth/tokens") and request.command == "POST":
            return self._token_exchange(request, body)
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return _answer(request, 401, error_body(401, "NotAuthorizedException",
                                                    "the gateway refused the request: missing or invalid token"))
        if self.warehouses is not None and path.path.endswith("/config"):
            warehouse = (parse_qs(path.query).get("warehouse") or [None])[0]
            if warehouse not in self.warehouses:
                return _answer(request, 404, error_body(404, "NoSuchWarehouseException",
                                                        f"warehouse {warehouse!r} does not exist"))
        commit = is_commit(request.command, request.path)
        fault = self._take_fault() if commit else None
        if commit:
            self.commits_seen += 1
        status, headers, answer = self._forward(request, body)
        if fault is not None and fault.lose:
            if fault.then is not None:
                fault.then()
            request.close_connection = True
            request.connection.shutdown(socket.SHUT_RDWR)  # the client sees its connection dropped, no answer
            return None
        if fault is not None and fault.delay_seconds:
            time.sleep(fault.delay_seconds)
        return _answer(request, status, answer, headers)

    def _forward(self, request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
            connection.request(request.command, request.path, body=body or None, headers=headers)
            response = connection.getresponse()
            answer = response.read()
            return response.status, [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_HEADERS], answer
        except OSError as exc:
            return 502, [("Content-Type", "application/json")], error_body(502, "BadGateway", f"upstream: {exc}")
        finally:
            connection.close()

    def _token_exchange(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        given = f"{form.get('client_id', '')}:{form.get('client_secret', '')}"
        if self.credential is None or given != self.credential:
            answer = json.dumps({"error": "invalid_client", "error_description": "unknown client or wrong secret"})
            return _answer(request, 401, answer.encode())
        answer = json.dumps({"access_token": self.token or "gateway-token", "token_type": "bearer",
                             "expires_in": 3600, "issued_token_type": "urn:ietf:params:oauth:token-type:access_token"})
        return _answer(request, 200, answer.encode())


def _answer(request: BaseHTTPRequestHandler, status: int, body: bytes,
            headers: list[tuple[str, str]] | None = None) -> None:
    request.send_response(status)
    for key, value in headers or [("Content-Type", "application/json")]:
        request.send_header(key, value)
    request.send_header("Content-Length", str(len(body)))
    request.end_headers()
    if request.command != "HEAD":
        request.wfile.write(body)
