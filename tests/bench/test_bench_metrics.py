"""What metricsExporterType=PROM costs a broker's sends, measured in the same run: one `rmq broker`
with metrics off (the baseline, the default a user gets) and one with the Prometheus exporter on
(being scraped once a second meanwhile, as a Prometheus server would, a bit more often).

- pipelined: 2000 SEND_MESSAGE_V2 frames written at once, all answers read (the native send lane:
  counted per topic run, timed per read chunk);
- producer: one-at-a-time sync `Producer.send` of a 128-byte body, what an application does.
"""
import threading
import urllib.request

import pytest

from rmq_core import Message, Producer
from tests.bench.test_bench_broker_send import _check_send, _pipelined
from tests.servers import NamesrvAndBroker, free_port


class _Scraper:
    def __init__(self, port: int):
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.stop = threading.Event()
        self.scrapes = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.wait(1.0):
            with urllib.request.urlopen(self.url, timeout=10) as r:
                r.read()
            self.scrapes += 1

    def close(self):
        self.stop.set()
        self.thread.join(15)


@pytest.fixture(scope="module")
def broker_metrics_off(tmp_path_factory):
    cluster = NamesrvAndBroker(tmp_path_factory.mktemp("bench-metrics-off"), broker_props={"flushDiskType": "ASYNC_FLUSH"})
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def broker_metrics_on(tmp_path_factory):
    port = free_port()
    cluster = NamesrvAndBroker(tmp_path_factory.mktemp("bench-metrics-on"), broker_props={
        "flushDiskType": "ASYNC_FLUSH", "metricsExporterType": "PROM", "metricsPromExporterPort": port})
    scraper = _Scraper(port)
    yield cluster
    scraper.close()
    assert scraper.scrapes > 0
    cluster.stop()


def _port(cluster) -> int:
    return int(cluster.broker_addrs[0].rpartition(":")[2])


@pytest.mark.benchmark(group="metrics-send-pipelined")
def test_metrics_pipelined_baseline_metrics_off(benchmark, broker_metrics_off):
    _pipelined(benchmark, _port(broker_metrics_off), _check_send)


@pytest.mark.benchmark(group="metrics-send-pipelined")
def test_metrics_pipelined_prom_on(benchmark, broker_metrics_on):
    _pipelined(benchmark, _port(broker_metrics_on), _check_send)


def _producer_sends(benchmark, cluster) -> None:
    with Producer("PG_BENCH_METRICS", namesrv=cluster.namesrv) as p:
        msg = Message("BenchMetrics", b"x" * 128)
        for _ in range(200):  # route, topic creation, connections
            p.send(msg)
        benchmark.pedantic(lambda: p.send(msg), rounds=3000, warmup_rounds=100)
    benchmark.extra_info["msgs_per_s"] = round(1 / benchmark.stats.stats.median)


@pytest.mark.benchmark(group="metrics-producer-sync-send")
def test_metrics_producer_baseline_metrics_off(benchmark, broker_metrics_off):
    _producer_sends(benchmark, broker_metrics_off)


@pytest.mark.benchmark(group="metrics-producer-sync-send")
def test_metrics_producer_prom_on(benchmark, broker_metrics_on):
    _producer_sends(benchmark, broker_metrics_on)


