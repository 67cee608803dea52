"""Scheduler: one daemon thread running periodic jobs one after another (a tiny
ScheduledExecutorService).  The client instance runs its route refresh, heartbeat and offset
persistence on one."""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Any, Callable

log = logging.getLogger("rmq.client")


class Scheduler:
    """A tiny ScheduledExecutorService: jobs run one after another on one daemon thread."""

    def __init__(self, name: str):
        self._name = name
        self._cond = threading.Condition()
        self._heap: list = []
        self._seq = itertools.count()
        self._cancelled: set = set()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def schedule(self, fn: Callable[[], Any], interval: float | None, initial_delay: float = 0.0, name: str = "") -> int:
        """Run fn after initial_delay, then every `interval` seconds (None: once).  Returns a handle."""
        handle = next(self._seq)
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + initial_delay, handle, fn, interval, name))
            self._cond.notify()
        return handle

    def cancel(self, handle: int) -> None:
        with self._cond:
            self._cancelled.add(handle)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._cond.wait(None if not self._heap else max(0.0, self._heap[0][0] - time.monotonic()))
                if self._stopped:
                    return
                when, handle, fn, interval, name = heapq.heappop(self._heap)
                if handle in self._cancelled:
                    self._cancelled.discard(handle)
                    continue
            try:
                fn()
            except Exception:  # a periodic job must never kill the scheduler
                log.exception("scheduled job %s failed", name or fn)
            if interval is not None:
                with self._cond:
                    if handle in self._cancelled:
                        self._cancelled.discard(handle)
                    else:
                        heapq.heappush(self._heap, (time.monotonic() + interval, handle, fn, interval, name))


__all__ = ["Scheduler"]
