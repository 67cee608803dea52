"""Broker counters (RocketMQ's BrokerStatsManager, the part admin and metrics read)."""
from __future__ import annotations

import threading
import time
from collections import defaultdict, deque

_time = time.time


class _Rate:
    """Events per second over a sliding minute, sampled per second.

    The current second is two plain fields (`sec`, `count`) that `add` bumps, and a finished
    second moves to `samples` only when the next one starts: a put costs an integer compare and
    an add, not a list lookup."""

    __slots__ = ("samples", "sec", "count")

    def __init__(self):
        self.samples = deque(maxlen=60)  # (second, events) of the finished seconds
        self.sec = 0
        self.count = 0

    def add(self, n: int, sec: int | None = None) -> None:
        if sec is None:
            sec = int(time.time())
        if sec == self.sec:
            self.count += n
        else:
            self._roll(sec, n)

    def _roll(self, sec: int, n: int) -> None:
        if self.count:
            self.samples.append((self.sec, self.count))
        self.sec, self.count = sec, n

    def tps(self) -> float:
        now = int(time.time())
        recent = [n for s, n in self.samples if now - 60 <= s < now]
        if now - 60 <= self.sec < now:
            recent.append(self.count)
        return sum(recent) / 60.0 if recent else 0.0


class BrokerStats:
    def __init__(self):
        self._lock = threading.Lock()
        self.put_nums = defaultdict(int)
        self.put_size = defaultdict(int)
        self.get_nums = defaultdict(int)
        self.get_size = defaultdict(int)
        self.put_rate = _Rate()
        self.get_rate = _Rate()
        self._group_get = defaultdict(_Rate)
        self.boot_timestamp = int(time.time() * 1000)

    def inc_put(self, topic: str, n: int, size: int) -> None:
        # Called for every put: the rate's current second is bumped inline (see _Rate).
        sec = int(_time())
        lock = self._lock
        lock.acquire()  # (cheaper than `with` on this path)
        try:
            self.put_nums[topic] += n
            self.put_size[topic] += size
            rate = self.put_rate
            if sec == rate.sec:
                rate.count += n
            else:
                rate._roll(sec, n)
        finally:
            lock.release()

    def inc_get(self, group: str, topic: str, n: int, size: int) -> None:
        with self._lock:
            key = f"{topic}@{group}"
            self.get_nums[key] += n
            self.get_size[key] += size
            self.get_rate.add(n)
            self._group_get[group].add(n)

    def group_get_tps(self, group: str) -> float:
        with self._lock:
            r = self._group_get.get(group)
            return r.tps() if r else 0.0

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return {
                "msgPutTotalTodayNow": str(sum(self.put_nums.values())),
                "msgGetTotalTodayNow": str(sum(self.get_nums.values())),
                "putTps": f"{self.put_rate.tps():.2f}",
                "getTransferedTps": f"{self.get_rate.tps():.2f}",
                "bootTimestamp": str(self.boot_timestamp),
            }
