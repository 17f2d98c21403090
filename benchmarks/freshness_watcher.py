"""What runs beside a freshness run's measured phase (the sampler, the faults): a thread started at the producer's
start, whose failure the benchmark's wait loop raises and which stops when the run ends."""

from __future__ import annotations

import threading


class Watcher(threading.Thread):
    """Subclasses implement `watch`, waiting with `pause` (which returns True once asked to stop)."""

    what = "a watcher"  # for the error: "<what> failed"
    stop_timeout = 60.0

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.started_at = 0.0  # epoch s: the measured producer's start
        self.error: BaseException | None = None
        self._stop_asked = threading.Event()

    def begin(self, started_at: float) -> None:
        self.started_at = started_at
        self.start()

    def watch(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        try:
            self.watch()
        except BaseException as exc:  # noqa: BLE001 - reported by check()
            self.error = exc

    def pause(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True when the run asked the watcher to stop meanwhile."""
        return self._stop_asked.wait(max(0.0, seconds))

    def check(self) -> None:
        """Raise if the watcher failed (the run cannot be trusted then)."""
        if self.error is not None:
            raise RuntimeError(f"{self.what} failed: {self.error!r}") from self.error

    def stop(self) -> None:
        self._stop_asked.set()
        if self.is_alive():
            self.join(self.stop_timeout)
