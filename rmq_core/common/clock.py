"""The wall clock in RocketMQ's unit: milliseconds since the epoch (store and born timestamps,
subscription versions, delay and timer due times)."""
from __future__ import annotations

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000


__all__ = ["now_ms"]
