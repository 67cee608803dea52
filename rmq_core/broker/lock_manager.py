"""Broker-side queue locks for orderly consumption (RocketMQ's RebalanceLockManager).

A lock is a lease: it belongs to one client id until it expires (`lock_max_live_time_ms`, 60 s)
unless renewed by the same client.
"""
from __future__ import annotations

import threading
import time

from rmq_core.message import MessageQueue


class RebalanceLockManager:
    def __init__(self, lock_max_live_time_ms: int = 60_000):
        self.lock_max_live_time_ms = lock_max_live_time_ms
        self._table: dict[str, dict[MessageQueue, list]] = {}  # group -> mq -> [client_id, last_ms]
        self._lock = threading.Lock()

    def _now(self) -> float:
        return time.monotonic() * 1000

    def _expired(self, entry) -> bool:
        return self._now() - entry[1] > self.lock_max_live_time_ms

    def try_lock_batch(self, group: str, mqs, client_id: str) -> set[MessageQueue]:
        locked = set()
        with self._lock:
            table = self._table.setdefault(group, {})
            for mq in mqs:
                entry = table.get(mq)
                if entry is None or entry[0] == client_id or self._expired(entry):
                    table[mq] = [client_id, self._now()]
                    locked.add(mq)
        return locked

    def unlock_batch(self, group: str, mqs, client_id: str) -> None:
        with self._lock:
            table = self._table.get(group, {})
            for mq in mqs:
                entry = table.get(mq)
                if entry is not None and entry[0] == client_id:
                    del table[mq]

    def owner(self, group: str, mq: MessageQueue) -> str | None:
        with self._lock:
            entry = self._table.get(group, {}).get(mq)
            return None if entry is None or self._expired(entry) else entry[0]
