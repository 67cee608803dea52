"""The console's time series (rocketmq-dashboard's collect task): every `interval` seconds a
sampler thread asks the cluster for the brokers' own stats and keeps the last `points` samples of

* each broker's in and out TPS (its runtime info: putTps, getTransferedTps),
* each normal topic's in TPS (VIEW_BROKER_STATS_DATA TOPIC_PUT_NUMS, the last minute's rate,
  summed over the topic's masters),
* each consumer group's lag and consume TPS (GET_CONSUME_STATS: diff total, consumeTps).

Topics and groups cost an admin call each per sample, so at most `max_topics` topics and
`max_groups` groups are sampled per round, in turn (a series of a cluster with more has gaps, not
a stall).  Nothing is stored on disk: a console started afresh shows its first points after one
interval."""
from __future__ import annotations

import collections
import logging
import threading
import time

from rmq_core.errors import ConfigError, RMQError
from rmq_core.message import MixAll, TopicValidator

log = logging.getLogger("rmq.dashboard")

DEFAULT_INTERVAL = 10.0  # seconds between samples
DEFAULT_POINTS = 360  # samples kept per series: an hour at the default interval


class StatsHistory:
    """Time series of one cluster, sampled by a daemon thread over `admin` (an AdminClient)."""

    def __init__(self, admin, interval: float = DEFAULT_INTERVAL, points: int = DEFAULT_POINTS,
                 max_topics: int = 200, max_groups: int = 200):
        if not interval > 0:
            raise ConfigError(f"bad stats interval {interval!r}: expected seconds > 0 (or 0 for a console without charts)")
        self.admin = admin
        self.interval = interval
        self.points = points
        self.max_topics, self.max_groups = max_topics, max_groups
        self._lock = threading.Lock()
        # name -> deque of (epoch s, value...); brokers: (t, in_tps, out_tps), topics: (t, tps),
        # groups: (t, diff_total, consume_tps)
        self.brokers: dict[str, collections.deque] = {}
        self.topics: dict[str, collections.deque] = {}
        self.groups: dict[str, collections.deque] = {}
        self._turn = {"topics": 0, "groups": 0}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "StatsHistory":
        self._thread = threading.Thread(target=self._run, name="rmq-console-stats", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.sample()
            except (RMQError, OSError, TimeoutError) as e:  # a name server away: try again next round
                log.warning("console stats sample failed: %s", e)
            except Exception:  # a bug: logged, the sampler goes on
                log.exception("console stats sample failed")
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def _add(self, table: dict, name: str, point: tuple) -> None:
        with self._lock:
            series = table.get(name)
            if series is None:
                series = table[name] = collections.deque(maxlen=self.points)
            series.append(point)

    def _in_turn(self, kind: str, names: list[str], cap: int) -> list[str]:
        if len(names) <= cap:
            return names
        start = self._turn[kind] % len(names)
        self._turn[kind] = start + cap
        return (names[start:] + names[:start])[:cap]

    def sample(self) -> None:
        """One round: every broker, then the topics and groups of this round's turn."""
        admin = self.admin
        now = time.time()
        for b in admin.brokers():
            try:
                rt = admin.broker_runtime_info(b.addr)
            except RMQError:
                continue  # a broker that does not answer: a gap in its line
            self._add(self.brokers, f"{b.broker_name}/{b.broker_id}",
                      (now, _rate(rt.get("putTps")), _rate(rt.get("getTransferedTps"))))
        topics = [t for t in admin.topic_list()
                  if not (MixAll.is_retry_topic(t) or MixAll.is_dlq_topic(t) or TopicValidator.is_system_topic(t))]
        for t in self._in_turn("topics", topics, self.max_topics):
            try:
                tps = 0.0
                for _, addr in admin.topic_master_addrs(t):
                    d = admin.stats_data(addr, "TOPIC_PUT_NUMS", t)
                    if d:
                        tps += float(d["statsMinute"]["tps"])
            except RMQError:
                continue  # (a topic deleted meanwhile, or a broker away)
            self._add(self.topics, t, (now, tps))
        for g in self._in_turn("groups", admin.consumer_groups(), self.max_groups):
            try:
                stats = admin.consume_stats(g)
            except RMQError:
                continue
            self._add(self.groups, g, (now, stats.diff_total, stats.consume_tps))

    # --- what the pages read -------------------------------------------------------------------------
    def broker_series(self) -> dict[str, list]:
        with self._lock:
            return {name: list(s) for name, s in sorted(self.brokers.items())}

    def busiest_topics(self, n: int = 5) -> dict[str, list]:
        """The `n` topics with the most messages in over the kept window, busiest first."""
        with self._lock:
            ranked = sorted(self.topics.items(), key=lambda kv: (-sum(p[1] for p in kv[1]), kv[0]))
            return {name: list(s) for name, s in ranked[:n] if any(p[1] for p in s)}

    def topic_series(self, topic: str) -> list:
        with self._lock:
            return list(self.topics.get(topic, ()))

    def group_series(self, group: str) -> list:
        with self._lock:
            return list(self.groups.get(group, ()))


def _rate(v) -> float:
    """A runtime-info rate: RocketMQ's "tps10s tps60s tps600s" text (the first), or one number."""
    try:
        return float(str(v).split()[0])
    except (TypeError, ValueError, IndexError):
        return 0.0
