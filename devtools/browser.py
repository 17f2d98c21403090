"""A real headless browser for the UI tests: Debian's Chromium, driven through the DevTools protocol.

Chromium runs with a fresh profile and without network services of its own; its DevTools
port comes from reserve_port. `Page` is the little the tests need: set a cookie, open a URL,
wait for the document (and its frames) to load, evaluate JavaScript in the page or in one of
its frames, take a screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

from devtools.ports import reserve_port
from devtools.processes import stop_session

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                  "--hide-scrollbars", "--mute-audio")


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("no Chromium found: install Debian's `chromium` package (make system-deps does)")


class Browser:
    """Headless Chromium with a fresh --user-data-dir, stopped (and its profile removed) by stop()."""

    def __init__(self, width: int = 1440, height: int = 1000) -> None:
        self.port = reserve_port()
        self.profile = Path(tempfile.mkdtemp(prefix="aeo-chromium-"))
        self.size = (width, height)
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> "Browser":
        log = open(self.profile / "chromium.log", "ab")
        self.process = subprocess.Popen(
            [chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={self.profile / 'profile'}",
             f"--remote-debugging-port={self.port}", "--remote-debugging-address=127.0.0.1",
             f"--window-size={self.size[0]},{self.size[1]}", "about:blank"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Chromium exited with {self.process.returncode}: "
                                   f"{(self.profile / 'chromium.log').read_text(errors='replace')[-2000:]}")
            try:
                self._json("/json/version")
                return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"Chromium's DevTools did not answer on port {self.port} in {timeout:.0f}s")

    def _json(self, path: str, method: str = "GET") -> Any:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read().decode())

    def new_page(self) -> "Page":
        target = self._json("/json/new?about:blank", method="PUT")
        return Page(target["webSocketDebuggerUrl"], self.size)

    def stop(self) -> None:
        if self.process is not None:
            stop_session(self.process, 10)
            self.process = None
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class Page:
    """One tab, over its DevTools websocket."""

    def __init__(self, ws_url: str, size: tuple[int, int]) -> None:
        self._resources = contextlib.ExitStack()  # websockets wants its connection used as a context manager
        self._ws = self._resources.enter_context(connect(ws_url, max_size=64 * 1024 * 1024, open_timeout=30))
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Network.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                  mobile=False)

    def send(self, method: str, timeout: float = 60.0, **params: Any) -> dict[str, Any]:
        ident = next(self._ids)
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self._ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method} failed: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def set_cookie(self, url: str, name: str, value: str) -> None:
        self.send("Network.setCookie", url=url, name=name, value=value, path="/", httpOnly=True)

    def open(self, url: str, timeout: float = 60.0) -> int | None:
        """Navigate and wait for the load event; returns the HTTP status of the document."""
        self.events.clear()
        result = self.send("Page.navigate", url=url)
        if result.get("errorText"):
            raise RuntimeError(f"opening {url} failed: {result['errorText']}")
        status = None
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("method") == "Network.responseReceived" and event["params"]["type"] == "Document" \
                        and status is None:
                    status = event["params"]["response"]["status"]
                if event.get("method") == "Page.loadEventFired":
                    return status
            self.events.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{url} did not load in {timeout:.0f}s")
            try:
                self.events.append(json.loads(self._ws.recv(timeout=remaining)))
            except TimeoutError:
                raise TimeoutError(f"{url} did not load in {timeout:.0f}s") from None

    def evaluate(self, expression: str, context_id: int | None = None) -> Any:
        """The JSON value of `expression` in the page (or in the execution context `context_id`)."""
        params: dict[str, Any] = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        if context_id is not None:
            params["contextId"] = context_id
        result = self.send("Runtime.evaluate", **params)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, context_id: int | None = None) -> Any:
        """Evaluate `expression` until it is truthy (the page renders in steps); returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression, context_id)
            except RuntimeError:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} stayed false for {timeout:.0f}s")
            time.sleep(0.5)

    def frame_context(self, url_part: str, timeout: float = 60.0) -> int:
        """An execution context inside the frame whose URL contains `url_part` (e.g. a plugin's iframe)."""
        deadline = time.monotonic() + timeout
        while True:
            frames = self._frames(self.send("Page.getFrameTree")["frameTree"])
            match = next((f for f in frames if url_part in f["url"]), None)
            if match is not None:
                world = self.send("Page.createIsolatedWorld", frameId=match["id"], worldName="aeo-tests")
                return world["executionContextId"]
            if time.monotonic() > deadline:
                raise TimeoutError(f"no frame with {url_part!r} in its URL after {timeout:.0f}s: "
                                   f"{[f['url'] for f in frames]}")
            time.sleep(0.5)

    @classmethod
    def _frames(cls, tree: dict[str, Any]) -> list[dict[str, Any]]:
        return [tree["frame"], *(f for child in tree.get("childFrames", []) for f in cls._frames(child))]

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        self._resources.close()
