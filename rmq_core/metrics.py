"""Metrics as RocketMQ 5 names them, exporter-neutral (RocketMQ's BrokerMetricsManager side).

A server keeps plain counters while it works (BrokerStats, counted per topic run by the native
send lane and per pull batch, and RpcLatency below); an exporter asks for a snapshot — a list of
`MetricFamily` — when it is scraped or on its interval.  Exporters are plugins chosen by
`metricsExporterType` (`PROM`, `LOG`, or any a plugin adds; `DISABLE` is the default), so this
module never imports prometheus_client.
"""
from __future__ import annotations

import bisect
import logging
import threading
from typing import Callable

import attrs

from rmq_core.config import DEFAULT_SERVER_SOCKET_BACKLOG
from rmq_core.errors import ConfigError

log = logging.getLogger("rmq.metrics")

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
DISABLE = "DISABLE"

# RocketMQ 5's bucket bounds: rpc latency in ms, message size in bytes.
RPC_LATENCY_BUCKETS_MS = (1.0, 3.0, 5.0, 10.0, 100.0, 1000.0, 3000.0)
MESSAGE_SIZE_BUCKETS = (1024.0, 4096.0, 512 * 1024.0, 1024 * 1024.0, 2 * 1024 * 1024.0, 4 * 1024 * 1024.0)


@attrs.frozen
class HistogramValue:
    """Cumulative bucket counts over `bounds` (plus +Inf = count), and the sum."""
    bounds: tuple[float, ...]
    counts: tuple[int, ...]  # per bucket, not cumulative; len(bounds) + 1 (the last is the overflow)
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        out, acc = [], 0
        for bound, n in zip(self.bounds + (float("inf"),), self.counts):
            acc += n
            out.append(("+Inf" if bound == float("inf") else _fmt_bound(bound), acc))
        return out


def _fmt_bound(b: float) -> str:
    return repr(float(b))  # "1024.0", as prometheus_client writes its own bucket bounds


@attrs.frozen
class MetricFamily:
    """One metric: `name` without the `_total` a counter is exposed with; `samples` are
    (label values in `labels` order, value), the value a HistogramValue for a histogram."""
    name: str
    kind: str
    doc: str
    labels: tuple[str, ...]
    samples: list = attrs.field(factory=list)
    unit: str = ""


class Buckets:
    """Per-key histogram counts kept as plain lists (one bisect and two adds to observe)."""

    __slots__ = ("bounds", "table", "_lock")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.table: dict = {}  # key -> [counts..., sum]
        self._lock = threading.Lock()

    def observe(self, key, value: float, times: int = 1) -> None:
        i = bisect.bisect_left(self.bounds, value)
        with self._lock:
            row = self.table.get(key)
            if row is None:
                row = self.table[key] = [0] * (len(self.bounds) + 2)
            row[i] += times
            row[-1] += value * times

    def values(self) -> list[tuple[object, HistogramValue]]:
        with self._lock:
            rows = [(k, list(r)) for k, r in self.table.items()]
        return [(k, HistogramValue(self.bounds, tuple(r[:-1]), float(r[-1]))) for k, r in rows]


class RpcLatency:
    """rocketmq_rpc_latency: time from a request's arrival to its answer, per request and
    response code.  Installed on a server's processor table only while an exporter runs."""

    def __init__(self):
        self.buckets = Buckets(RPC_LATENCY_BUCKETS_MS)

    def observe(self, request_code: int, response_code: int, seconds: float, times: int = 1) -> None:
        self.buckets.observe((request_code, response_code), seconds * 1000.0, times)

    def family(self, const: dict[str, str]) -> MetricFamily:
        from rmq_core.remoting.codes import RequestCode, ResponseCode

        def name(enum_cls, code):
            try:
                return enum_cls(code).name.lower()
            except ValueError:
                return str(code)

        samples = [(tuple(const.values()) + ("remoting", name(RequestCode, req), name(ResponseCode, resp)), h)
                   for (req, resp), h in sorted(self.buckets.values(), key=lambda kv: kv[0])]
        return MetricFamily("rocketmq_rpc_latency", HISTOGRAM, "Time from a request's arrival to its answer",
                            tuple(const) + ("protocol_type", "request_code", "response_code"), samples, "ms")


@attrs.define
class ExporterSettings:
    """What an exporter plugin is given: where to listen (PROM), how often to log (LOG), and
    `collect()` giving the snapshot."""
    collect: Callable[[], list[MetricFamily]]
    host: str = "0.0.0.0"
    port: int = 5557
    interval_ms: int = 10_000
    node: str = ""  # "broker[broker-a, 127.0.0.1:10911]", for log lines
    backlog: int = DEFAULT_SERVER_SOCKET_BACKLOG  # serverSocketBacklog of the endpoint (PROM)


def check_exporter_type(exporter_type: str | None):
    """The factory `metricsExporterType` names (None for DISABLE); PluginNotFoundError naming the
    available exporters for an unknown name."""
    name = (exporter_type or DISABLE).strip().upper()
    if name in ("", DISABLE):
        return None
    from rmq_core.plugins import get_metrics_exporter_factory

    return get_metrics_exporter_factory(name)


def start_exporter(exporter_type: str | None, settings: ExporterSettings):
    """Start the exporter named by `metricsExporterType` (None/DISABLE: none).  An unknown name
    fails with the available ones; a port in use fails naming it."""
    factory = check_exporter_type(exporter_type)
    if factory is None:
        return None
    name = exporter_type.strip().upper()
    exporter = factory(settings)
    try:
        exporter.start()
    except OSError as e:
        raise ConfigError(f"metricsExporterType={name}: cannot listen on {settings.host}:{settings.port}: "
                          f"{e.strerror or e}") from None
    log.info("metrics exporter %s started for %s", name, settings.node or "this server")
    return exporter
