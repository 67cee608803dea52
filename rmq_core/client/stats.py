"""A push consumer's consumption per topic, as RocketMQ's ConsumerStatsManager keeps it for the
running info's statusTable (ConsumeStatus): messages consumed OK and failed per second over the
last minute, the listener's time per call over the last minute, and the messages that failed in
the last hour.

The listeners' threads add cumulative counts; a snapshot of them is kept at most every
SNAPSHOT_EVERY seconds (taken before the counts it precedes, for an hour), and a window's figures
are the counts now less those of the window's oldest snapshot, over the time since it."""
from __future__ import annotations

import collections
import threading
import time

SNAPSHOT_EVERY = 10.0
MINUTE, HOUR = 60.0, 3600.0
_ZERO = (0, 0, 0.0, 0)  # ok, failed, listener ms, listener calls


class ConsumerStats:
    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._totals: dict[str, list] = {}
        self._snapshots: collections.deque = collections.deque()  # (time, {topic: totals})

    def consumed(self, topic: str, ok: int, failed: int, listener_ms: float, calls: int) -> None:
        """`calls` listener calls on `topic` took `listener_ms` and left `ok` messages consumed and
        `failed` to retry."""
        now = self._clock()
        with self._lock:
            snaps = self._snapshots
            if not snaps or now - snaps[-1][0] >= SNAPSHOT_EVERY:
                snaps.append((now, {k: tuple(v) for k, v in self._totals.items()}))
                while len(snaps) > 1 and now - snaps[1][0] >= HOUR:
                    snaps.popleft()
            t = self._totals.get(topic)
            if t is None:
                t = self._totals[topic] = [0, 0, 0.0, 0]
            t[0] += ok
            t[1] += failed
            t[2] += listener_ms
            t[3] += calls

    def totals(self) -> tuple[int, int]:
        """(messages consumed OK, failed) since the start, all topics."""
        with self._lock:
            return sum(t[0] for t in self._totals.values()), sum(t[1] for t in self._totals.values())

    def _window(self, now: float, span: float) -> tuple[float, dict]:
        """The oldest snapshot within the last `span` seconds; (now, the counts now) when none is."""
        for at, counts in self._snapshots:
            if now - at <= span:
                return at, counts
        return now, {k: tuple(v) for k, v in self._totals.items()}

    def status_table(self) -> dict:
        """topic -> RocketMQ's ConsumeStatus fields (consumeRT in ms per listener call)."""
        now = self._clock()
        with self._lock:
            minute_at, minute = self._window(now, MINUTE)
            _, hour = self._window(now, HOUR)
            elapsed = now - minute_at
            out = {}
            for topic, cur in self._totals.items():
                m, h = minute.get(topic, _ZERO), hour.get(topic, _ZERO)
                calls = cur[3] - m[3]
                out[topic] = {
                    "consumeRT": round((cur[2] - m[2]) / calls, 3) if calls else 0.0,
                    "consumeOKTPS": round((cur[0] - m[0]) / elapsed, 3) if elapsed > 0 else 0.0,
                    "consumeFailedTPS": round((cur[1] - m[1]) / elapsed, 3) if elapsed > 0 else 0.0,
                    "consumeFailedMsgs": cur[1] - h[1],
                }
            return out
