"""What metricsExporterType=PROM costs a broker's sends, measured in the same run: one `rmq broker`
with metrics off (the baseline, the default a user gets) and one with the Prometheus exporter on
(scraped once a second meanwhile, a little more often than a Prometheus server would).

- pipelined: 2000 SEND_MESSAGE_V2 frames written at once, all answers read (the native send lane:
  counted per topic run, timed per read chunk);
- producer: one-at-a-time sync `Producer.send` of a 128-byte body, what an application does.

This shared VM's neighbours move whole stretches of rounds, so every timed round of one broker is
preceded by an untimed round of the other (pedantic's setup), and `extra_info["on_vs_off"]` is
the PROM broker's rate over the metrics-off broker's from the same stretch of time, in both entries
(the figure to read; `records_per_s`, and so "vs baseline", compares entries measured at
different times).
"""
import statistics
import threading
import time
import urllib.request

import pytest

from rmq_core import Message, Producer
from tests.bench.test_bench_broker_send import PIPELINE, _check_send, _connect, _recv_frame, _send_frame
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
def brokers(tmp_path_factory):
    """(metrics off, PROM on), alive together."""
    off = NamesrvAndBroker(tmp_path_factory.mktemp("bench-metrics-off"), broker_props={"flushDiskType": "ASYNC_FLUSH"})
    port = free_port()
    on = NamesrvAndBroker(tmp_path_factory.mktemp("bench-metrics-on"), broker_props={
        "flushDiskType": "ASYNC_FLUSH", "metricsExporterType": "PROM", "metricsPromExporterPort": port})
    scraper = _Scraper(port)
    yield off, on
    scraper.close()
    assert scraper.scrapes > 0
    on.stop()
    off.stop()


def _paired(benchmark, timed, other, rounds: int, per_round: int, timed_is_on: bool) -> None:
    other_times = []

    def setup():
        t0 = time.perf_counter()
        other()
        other_times.append(time.perf_counter() - t0)

    benchmark.pedantic(timed, setup=setup, rounds=rounds, warmup_rounds=2)
    median, other_median = benchmark.stats.stats.median, statistics.median(other_times)
    benchmark.extra_info["records_per_s"] = round(per_round / median)
    # the PROM broker's rate over the metrics-off broker's, over this entry's interleaved rounds
    benchmark.extra_info["on_vs_off"] = round(other_median / median if timed_is_on else median / other_median, 3)


class _Pipeline:
    """PIPELINE sends written at once by a writer thread, every answer read."""

    def __init__(self, cluster):
        self.payload = b"".join(_send_frame(i) for i in range(PIPELINE))
        self.sock = _connect(int(cluster.broker_addrs[0].rpartition(":")[2]))
        self.last = None
        for _ in range(3):  # topic auto-creation, the send cache
            self()

    def __call__(self):
        writer = threading.Thread(target=self.sock.sendall, args=(self.payload,))
        writer.start()
        got = [_recv_frame(self.sock) for _ in range(PIPELINE)]
        writer.join()
        self.last = got[-1]

    def close(self):
        self.sock.close()
        _check_send(self.last)


@pytest.fixture(scope="module")
def pipelines(brokers):
    off, on = _Pipeline(brokers[0]), _Pipeline(brokers[1])
    yield off, on
    off.close()
    on.close()


@pytest.mark.benchmark(group="metrics-send-pipelined")
def test_metrics_pipelined_baseline_metrics_off(benchmark, pipelines):
    _paired(benchmark, pipelines[0], pipelines[1], 30, PIPELINE, timed_is_on=False)


@pytest.mark.benchmark(group="metrics-send-pipelined")
def test_metrics_pipelined_prom_on(benchmark, pipelines):
    _paired(benchmark, pipelines[1], pipelines[0], 30, PIPELINE, timed_is_on=True)


class _Sends:
    """200 one-at-a-time sync sends of a 128-byte body (a round)."""

    def __init__(self, cluster):
        self.producer = Producer("PG_BENCH_METRICS", namesrv=cluster.namesrv).start()
        self.msg = Message("BenchMetrics", b"x" * 128)
        self()

    def __call__(self):
        send, msg = self.producer.send, self.msg
        for _ in range(200):
            send(msg)


@pytest.fixture(scope="module")
def senders(brokers):
    off, on = _Sends(brokers[0]), _Sends(brokers[1])
    yield off, on
    off.producer.shutdown()
    on.producer.shutdown()


@pytest.mark.benchmark(group="metrics-producer-sync-send")
def test_metrics_producer_baseline_metrics_off(benchmark, senders):
    _paired(benchmark, senders[0], senders[1], 30, 200, timed_is_on=False)


@pytest.mark.benchmark(group="metrics-producer-sync-send")
def test_metrics_producer_prom_on(benchmark, senders):
    _paired(benchmark, senders[1], senders[0], 30, 200, timed_is_on=True)
