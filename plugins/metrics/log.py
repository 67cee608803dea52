"""`metricsExporterType=LOG`: the snapshot written to the `rmq.metrics` log on an interval
(RocketMQ 5's LoggingMetricExporter), one line per sample."""
from __future__ import annotations

import logging
import threading

from rmq_core.metrics import HISTOGRAM, ExporterSettings

log = logging.getLogger("rmq.metrics")


def format_snapshot(families) -> list[str]:
    lines = []
    for fam in families:
        for values, v in fam.samples:
            labels = ",".join(f'{k}="{val}"' for k, val in zip(fam.labels, values))
            if fam.kind == HISTOGRAM:
                v = f"count={v.count} sum={v.sum:g} buckets=" + ",".join(f"{le}:{n}" for le, n in v.cumulative())
            lines.append(f"{fam.name}{{{labels}}} {v}")
    return lines


class LogExporter:
    def __init__(self, settings: ExporterSettings):
        self.settings = settings
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rmq-metrics-log", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval = self.settings.interval_ms / 1000.0
        while not self._stop.wait(interval):
            self.log_once()

    def log_once(self) -> None:
        try:
            lines = format_snapshot(self.settings.collect())
        except Exception:
            log.exception("%s: collecting metrics failed", self.settings.node or "rmq")
            return
        for line in lines:
            log.info("%s %s", self.settings.node, line)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
