"""An HTTP server in a daemon thread of the test process, on 127.0.0.1: what the small test servers share.

devtools.rest_gateway (in front of a REST catalog) and devtools.oauth_provider (tokens and JWKS) each
give a request handler class; starting, stopping and `with` are here.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ThreadedHttpServer:
    """Serves `handler_class()` on 127.0.0.1:`port` from a daemon thread; `with` starts and stops it."""

    port: int
    thread_name = "http-server"
    _server: ThreadingHTTPServer | None = None

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self):
        if self._server is None:
            self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler_class())
            self._server.daemon_threads = True
            threading.Thread(target=self._server.serve_forever, name=self.thread_name, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
