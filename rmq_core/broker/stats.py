"""Broker counters (RocketMQ's BrokerStatsManager, the part admin and metrics read)."""
from __future__ import annotations

import threading
import time
from collections import defaultdict, deque


class _Rate:
    """Events per second over a sliding minute, sampled per second."""

    __slots__ = ("samples",)

    def __init__(self):
        self.samples = deque(maxlen=61)

    def add(self, n: int) -> None:
        sec = int(time.time())
        if self.samples and self.samples[-1][0] == sec:
            self.samples[-1][1] += n
        else:
            self.samples.append([sec, n])

    def tps(self) -> float:
        now = int(time.time())
        recent = [n for s, n in self.samples if now - 60 <= s < now]
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
        with self._lock:
            self.put_nums[topic] += n
            self.put_size[topic] += size
            self.put_rate.add(n)

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
