"""`metricsExporterType=PROM`: RocketMQ 5's Prometheus pull endpoint (`GET /metrics`).

prometheus_client is imported here only, when a server starts this exporter; the collector turns
the server's snapshot into metric families at scrape time, so nothing is counted twice."""
from __future__ import annotations

import logging
import threading

from rmq_core.metrics import COUNTER, GAUGE, HISTOGRAM, ExporterSettings

log = logging.getLogger("rmq.metrics")


class SnapshotCollector:
    """A prometheus_client custom collector over `collect()` (a list of MetricFamily)."""

    def __init__(self, collect):
        self._collect = collect

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        for fam in self._collect():
            labels = list(fam.labels)
            if fam.kind == COUNTER:
                out = CounterMetricFamily(fam.name, fam.doc, labels=labels)
                for values, v in fam.samples:
                    out.add_metric(list(values), v)
            elif fam.kind == GAUGE:
                out = GaugeMetricFamily(fam.name, fam.doc, labels=labels)
                for values, v in fam.samples:
                    out.add_metric(list(values), v)
            elif fam.kind == HISTOGRAM:
                out = HistogramMetricFamily(fam.name, fam.doc, labels=labels)
                for values, h in fam.samples:
                    out.add_metric(list(values), h.cumulative(), h.sum)
            else:
                raise ValueError(f"metric {fam.name}: unknown kind {fam.kind!r}")
            yield out

    def describe(self):
        return []  # collected lazily: describing would run a whole snapshot at registration


def _quiet(handler: type) -> type:
    """The request handler without a printed line per scrape (as prometheus_client's)."""
    return type("QuietHandler", (handler,), {"log_message": lambda self, *args: None})


class PromExporter:
    def __init__(self, settings: ExporterSettings):
        self.settings = settings
        self.port = settings.port
        self._server = None
        self._thread = None

    def start(self) -> None:
        # prometheus_client's start_http_server, with the endpoint's serverSocketBacklog (its server
        # listens with socketserver's 5)
        import socket
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client import CollectorRegistry, make_wsgi_app
        from prometheus_client.exposition import ThreadingWSGIServer

        from rmq_core.remoting.transport import with_backlog

        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(self.settings.collect))
        server_class = with_backlog(ThreadingWSGIServer, self.settings.backlog)
        server_class.address_family = socket.getaddrinfo(self.settings.host, self.settings.port,
                                                         type=socket.SOCK_STREAM)[0][0]
        self._server = make_server(self.settings.host, self.settings.port, make_wsgi_app(registry), server_class,
                                   handler_class=_quiet(WSGIRequestHandler))
        self._thread = threading.Thread(target=self._server.serve_forever, name="rmq-metrics-http", daemon=True)
        self._thread.start()
        self.port = self._server.server_port
        log.info("%s: Prometheus metrics on http://%s:%d/metrics", self.settings.node or "rmq",
                 self.settings.host, self.port)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self._thread.join(5)

