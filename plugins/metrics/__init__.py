"""Built-in metrics exporters, chosen by `metricsExporterType`: `PROM` (a Prometheus scrape
endpoint on metricsPromExporterHost:metricsPromExporterPort) and `LOG` (the snapshot written to
the `rmq.metrics` log every metricsLoggingExporterIntervalInMills).

An exporter is `factory(settings: rmq_core.metrics.ExporterSettings)` returning an object with
`start()` and `stop()`; it reads `settings.collect()` when it needs numbers.  A third-party
exporter registers the same way:

    @hookimpl
    def rmq_metrics_exporters():
        return {"STATSD": StatsdExporter}
"""
from rmq_core.plugins import hookimpl

from .log import LogExporter
from .prom import PromExporter


@hookimpl
def rmq_metrics_exporters():
    return {"PROM": PromExporter, "LOG": LogExporter}
