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
        # (topic, message type) -> messages / bytes of the types other than "normal" (the rest of
        # a topic's puts are normal: the lane's plain sends are counted by topic alone)
        self.put_nums_by_type = defaultdict(int)
        self.put_size_by_type = defaultdict(int)
        self.get_nums = defaultdict(int)
        self.get_size = defaultdict(int)
        self.put_rate = _Rate()
        self.get_rate = _Rate()
        self._group_get = defaultdict(_Rate)
        self.boot_timestamp = int(time.time() * 1000)
        # (topic, consumer group) -> messages sent to the group's DLQ; topic -> ends of transactions
        self.dlq_nums = defaultdict(int)
        self.commit_nums = defaultdict(int)
        self.rollback_nums = defaultdict(int)
        # rocketmq_message_size per topic (rmq_core.metrics.Buckets), kept only while metrics run
        self.message_size = None

    def enable_message_size(self) -> None:
        from rmq_core.metrics import MESSAGE_SIZE_BUCKETS, Buckets
        self.message_size = Buckets(MESSAGE_SIZE_BUCKETS)

    def inc_put(self, topic: str, n: int, size: int, message_type: str | None = None) -> None:
        # Called for every put: the rate's current second is bumped inline (see _Rate).
        sec = int(_time())
        lock = self._lock
        lock.acquire()  # (cheaper than `with` on this path)
        try:
            self.put_nums[topic] += n
            self.put_size[topic] += size
            if message_type is not None and message_type != "normal":
                self.put_nums_by_type[(topic, message_type)] += n
                self.put_size_by_type[(topic, message_type)] += size
            rate = self.put_rate
            if sec == rate.sec:
                rate.count += n
            else:
                rate._roll(sec, n)
        finally:
            lock.release()
        sizes = self.message_size
        if sizes is not None:  # a topic run's messages (the native lane's) count at their mean size
            sizes.observe(topic, size / n if n > 1 else size, n)

    def inc_dlq(self, topic: str, group: str) -> None:
        with self._lock:
            self.dlq_nums[(topic, group)] += 1

    def inc_transaction_end(self, topic: str, commit: bool) -> None:
        with self._lock:
            (self.commit_nums if commit else self.rollback_nums)[topic] += 1

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

    def counters(self) -> dict[str, dict]:
        """Copies of the per-topic / per-group tables, for a metrics snapshot."""
        with self._lock:
            return {"put_nums": dict(self.put_nums), "put_size": dict(self.put_size),
                    "put_nums_by_type": dict(self.put_nums_by_type), "put_size_by_type": dict(self.put_size_by_type),
                    "get_nums": dict(self.get_nums), "get_size": dict(self.get_size),
                    "dlq_nums": dict(self.dlq_nums), "commit_nums": dict(self.commit_nums),
                    "rollback_nums": dict(self.rollback_nums)}

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return {
                "msgPutTotalTodayNow": str(sum(self.put_nums.values())),
                "msgGetTotalTodayNow": str(sum(self.get_nums.values())),
                "putTps": f"{self.put_rate.tps():.2f}",
                "getTransferedTps": f"{self.get_rate.tps():.2f}",
                "bootTimestamp": str(self.boot_timestamp),
            }
