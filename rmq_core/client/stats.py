"""A push consumer's consumption per topic, as RocketMQ's ConsumerStatsManager keeps it for the
running info's statusTable (ConsumeStatus): messages pulled, consumed OK and failed per second
over the last minute, a pull's and a listener call's time over the last minute, and the messages
that failed in the last hour.

The pulls and the listeners' threads add cumulative counts; a snapshot of them is kept at most every
SNAPSHOT_EVERY seconds (taken before the counts it precedes, for an hour), and a window's figures
are the counts now less those of the window's oldest snapshot, over the time since it."""
from __future__ import annotations

import collections
import threading
import time

SNAPSHOT_EVERY = 10.0
MINUTE, HOUR = 60.0, 3600.0
# the counts of a topic: OK, failed, listener ms, listener calls, pulled messages, pull ms, pulls
_OK, _FAILED, _LISTENER_MS, _CALLS, _PULLED, _PULL_MS, _PULLS = range(7)
_ZERO = (0, 0, 0.0, 0, 0, 0.0, 0)


class ConsumerStats:
    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._totals: dict[str, list] = {}
        self._snapshots: collections.deque = collections.deque()  # (time, {topic: totals})

    def consumed(self, topic: str, ok: int, failed: int, listener_ms: float, calls: int) -> None:
        """`calls` listener calls on `topic` took `listener_ms` and left `ok` messages consumed and
        `failed` to retry."""
        self._add(topic, ((_OK, ok), (_FAILED, failed), (_LISTENER_MS, listener_ms), (_CALLS, calls)))

    def pulled(self, topic: str, found: int, pull_ms: float) -> None:
        """A pull of `topic` was answered after `pull_ms` (long polling included) with `found` messages."""
        self._add(topic, ((_PULLED, found), (_PULL_MS, pull_ms), (_PULLS, 1)))

    def _add(self, topic: str, counts) -> None:
        now = self._clock()
        with self._lock:
            snaps = self._snapshots
            if not snaps or now - snaps[-1][0] >= SNAPSHOT_EVERY:
                snaps.append((now, {k: tuple(v) for k, v in self._totals.items()}))
                while len(snaps) > 1 and now - snaps[1][0] >= HOUR:
                    snaps.popleft()
            t = self._totals.get(topic)
            if t is None:
                t = self._totals[topic] = list(_ZERO)
            for i, n in counts:
                t[i] += n

    def totals(self) -> tuple[int, int]:
        """(messages consumed OK, failed) since the start, all topics."""
        with self._lock:
            return sum(t[_OK] for t in self._totals.values()), sum(t[_FAILED] for t in self._totals.values())

    def _window(self, now: float, span: float) -> tuple[float, dict]:
        """The oldest snapshot within the last `span` seconds; (now, the counts now) when none is."""
        for at, counts in self._snapshots:
            if now - at <= span:
                return at, counts
        return now, {k: tuple(v) for k, v in self._totals.items()}

    def status_table(self) -> dict:
        """topic -> RocketMQ's ConsumeStatus fields (pullRT in ms per pull, consumeRT per listener call)."""
        now = self._clock()
        with self._lock:
            minute_at, minute = self._window(now, MINUTE)
            _, hour = self._window(now, HOUR)
            elapsed = now - minute_at
            out = {}
            for topic, cur in self._totals.items():
                m, h = minute.get(topic, _ZERO), hour.get(topic, _ZERO)

                def per(i: int, by: int | None = None) -> float:
                    d = cur[by] - m[by] if by is not None else elapsed
                    return round((cur[i] - m[i]) / d, 3) if d > 0 else 0.0

                out[topic] = {"pullRT": per(_PULL_MS, _PULLS), "pullTPS": per(_PULLED),
                              "consumeRT": per(_LISTENER_MS, _CALLS), "consumeOKTPS": per(_OK),
                              "consumeFailedTPS": per(_FAILED), "consumeFailedMsgs": cur[_FAILED] - h[_FAILED]}
            return out
