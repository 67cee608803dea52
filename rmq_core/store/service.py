"""ServiceThread: the one shape every background store service has (RocketMQ's ServiceThread):
a daemon thread running `run_once()` every `interval()` seconds until stopped, woken early by
`wakeup()`."""
from __future__ import annotations

import abc
import logging
import threading
import time

log = logging.getLogger("rmq.store")


class ServiceThread(abc.ABC):
    name = "ServiceThread"

    def __init__(self):
        self._stopped = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def interval(self) -> float:
        return 1.0

    @abc.abstractmethod
    def run_once(self) -> None:
        """Implemented by each subclass."""

    def on_stop(self) -> None:
        """Last work after the loop ends (e.g. a final flush)."""

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def wakeup(self) -> None:
        self._wake.set()

    def is_stopped(self) -> bool:
        return self._stopped.is_set()

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.interval())
            self._wake.clear()
            if self._stopped.is_set():
                break
            try:
                self.run_once()
            except Exception:  # a background service must survive one bad round
                log.exception("%s: round failed", self.name)
        try:
            self.on_stop()
        except Exception:
            log.exception("%s: final round failed", self.name)

    def shutdown(self, timeout: float = 30.0) -> None:
        self._stopped.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        self._thread = None


class FlushService(ServiceThread):
    """A flush every `interval_key` ms (a setting of the store config) of at least
    `least_pages_key` dirty pages, and of all of them once `thorough_ms()` has passed since the
    last such round (RocketMQ's FlushRealTimeService and FlushConsumeQueueService)."""

    interval_key = least_pages_key = ""

    def __init__(self, config, flush):
        super().__init__()
        self.config, self.flush = config, flush
        self._last_thorough = time.monotonic()

    def thorough_ms(self) -> float:
        return 10_000.0

    def interval(self) -> float:
        return getattr(self.config, self.interval_key) / 1000.0

    def run_once(self) -> None:
        least = getattr(self.config, self.least_pages_key)
        now = time.monotonic()
        if (now - self._last_thorough) * 1000 >= self.thorough_ms():
            self._last_thorough = now
            least = 0
        self.flush(least)
