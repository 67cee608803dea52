"""Delayed delivery benchmarks (group delay-delivery), `make bench` prints them beside the baseline.

Each round puts N messages (128-byte bodies) into one queue of a fresh topic on an embedded broker
— in the broker's event loop, through the same routing a SEND_MESSAGE takes
(`BrokerController.redirect_if_delayed`, then the store) — waits until all N are visible in the
real topic and reads them back with `get_message` (what a PULL does).

* baseline: plain messages (put + pull);
* schedule service: DELAY level 1 (1 s), re-put by `ScheduleMessageService`;
* timer wheel, spread: TIMER_DELIVER_MS = put time + 120 ms (just above timerPrecisionMs, so
  every message goes through the wheel), re-put by `TimerMessageService` — due times spread like
  the schedule case's;
* timer wheel, burst: all N due at the same millisecond, 600 ms after the round starts — the
  wheel's delivery capacity.

The round time of a delayed case includes its delay, so its ops/s is not comparable with the
baseline's; the figures that are, are in `extra_info`: `delivered_msgs_per_s` (N over the span from
the first due time to the last re-put, from the store timestamps), `lateness_p50_ms` /
`lateness_p99_ms` (re-put store time minus due time, per message), and `msgs_per_s` for the
baseline (N over its put+pull time).
"""
from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from rmq_core.codec import decode_messages
from rmq_core.embedded import Cluster
from rmq_core.store import MessageExtBrokerInner

N = 2000
PAD = b"p" * 122
TIMER_DELAY_MS = 120
BURST_AFTER_MS = 600
_topics = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("rmq-delay")), {
        "mappedFileSizeCommitLog": str(256 * 1024 * 1024), "messageIndexEnable": "false",
        "timerPrecisionMs": "100"}).start()
    yield c
    c.stop()


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _put_all(ctrl, topic: str, mode: str) -> list[int]:
    """Put N messages; returns each one's due time (ms)."""
    store = ctrl.store
    level1_ms = ctrl.store_config.delay_levels_ms[0]
    dues = []
    burst_due = _now_ms() + BURST_AFTER_MS
    for i in range(N):
        props = {"TAGS": "TagB"}
        if mode.startswith("timer"):
            due = _now_ms() + TIMER_DELAY_MS if mode == "timer_spread" else burst_due
            props["TIMER_DELIVER_MS"] = str(due)
        elif mode == "schedule":
            props["DELAY"] = "1"
        inner = ctrl.redirect_if_delayed(MessageExtBrokerInner(topic, 0, b"%06d" % i + PAD, properties=props))
        result, _ = store.put_message_nowait(inner)
        assert result.is_ok(), result
        if mode == "schedule":
            due = result.append_result.store_timestamp + level1_ms
        elif mode == "plain":
            due = result.append_result.store_timestamp
        dues.append(due)
        if i % 64 == 63:
            await asyncio.sleep(0)  # sends arrive interleaved with the services' work, as over a network
    return dues


def _read_all(store, topic: str) -> list:
    out = []
    off = 0
    while off < N:
        r = store.get_message("BENCH_GROUP", topic, 0, off, 32)
        if r.message_count == 0:
            time.sleep(0.0005)  # not delivered yet
            continue
        out += decode_messages(r.buffer, decompress=False)
        off = r.next_begin_offset
    return out


def _round(cluster, mode: str, figures: list) -> None:
    topic = f"BENCH_{mode.upper()}_{next(_topics)}"
    ctrl = cluster.broker
    dues = asyncio.run_coroutine_threadsafe(_put_all(ctrl, topic, mode), cluster.loop).result(60)
    msgs = _read_all(ctrl.store, topic)
    assert len(msgs) == N
    lateness = sorted(m.store_timestamp - dues[int(m.body[:6])] for m in msgs)
    span_ms = max(m.store_timestamp for m in msgs) - min(dues)
    figures.append((lateness, span_ms))


def _report(benchmark, mode: str, figures: list) -> None:
    lateness = sorted(x for lat, _ in figures for x in lat)
    span = sorted(s for _, s in figures)[len(figures) // 2]
    benchmark.extra_info["messages_per_round"] = N
    if mode == "plain":
        benchmark.extra_info["msgs_per_s"] = N / benchmark.stats.stats.median
        return
    benchmark.extra_info["delivered_msgs_per_s"] = N / max(span, 1) * 1000
    benchmark.extra_info["lateness_p50_ms"] = lateness[len(lateness) // 2]
    benchmark.extra_info["lateness_p99_ms"] = lateness[int(len(lateness) * 0.99)]
    benchmark.extra_info["lateness_max_ms"] = lateness[-1]


@pytest.mark.benchmark(group="delay-delivery")
def test_delivery_baseline_plain_put_pull(benchmark, cluster):
    figures = []
    benchmark.pedantic(_round, args=(cluster, "plain", figures), rounds=5, warmup_rounds=1)
    _report(benchmark, "plain", figures[1:])


@pytest.mark.benchmark(group="delay-delivery")
def test_delivery_schedule_delay_level(benchmark, cluster):
    figures = []
    benchmark.pedantic(_round, args=(cluster, "schedule", figures), rounds=3, warmup_rounds=1)
    _report(benchmark, "schedule", figures[1:])
    assert cluster.broker.schedule_service.delivered >= 4 * N


@pytest.mark.benchmark(group="delay-delivery")
@pytest.mark.parametrize("mode", ["timer_spread", "timer_burst"])
def test_delivery_timer_wheel(benchmark, cluster, mode):
    svc = cluster.broker.timer_service
    enqueued = svc.enqueued
    figures = []
    benchmark.pedantic(_round, args=(cluster, mode, figures), rounds=5, warmup_rounds=1)
    _report(benchmark, mode, figures[1:])
    assert svc.enqueued - enqueued == 6 * N, "every message must go through the wheel"
    assert all(min(lat) >= 0 for lat, _ in figures), "a timer message was delivered before its due time"
