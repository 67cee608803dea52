"""How the costs of pop consumption grow with the work the broker holds, not only their speed at
one size (the broker as `rmq namesrv` + `rmq broker` subprocesses, rmq's SimpleConsumer with
batch acks):

* test_pop_with_messages_in_flight[N]: receive+ack throughput of DRAIN messages while N other
  messages of the broker are received and not acked (open checkpoints, the revive heap, the
  in-flight tables).  extra_info: msgs/s, and vs_no_inflight, the ratio to the N=0 case of the
  same run (1.0: the in-flight state costs nothing per message).
* test_restart_with_unacked[N]: a broker SIGKILLed with N received-but-unacked messages, started
  again: the seconds until it answers (its boot replays the revive log's open part; every case
  stores the same messages, so the commit log's own recovery is the same), and extra_info
  replay_us_per_unacked, the growth over the N=0 restart of the same run per unacked message
  (constant when the replay is linear)."""
import itertools
import time

import pytest

from rmq_core import Message, Producer, SimpleConsumer
from tests.bench.test_bench_client import FAST
from tests.servers import NamesrvAndBroker

DRAIN = 10_000
INFLIGHT_SIZES = (0, 20_000, 100_000)
UNACKED_SIZES = (0, 10_000, 50_000)
TOPIC = "PopScale"
PROPS = {"flushDiskType": "ASYNC_FLUSH"}
SIMPLE = dict(consume_from_where="CONSUME_FROM_FIRST_OFFSET", await_duration=1.0, **FAST)
_ids = itertools.count()
_rates: dict[int, float] = {}
_restarts: dict[int, float] = {}


def _fill(namesrv: str, topic: str, n: int) -> None:
    with Producer(f"PG_POP_SCALE{next(_ids)}", namesrv=namesrv, **FAST) as p:
        p.send(Message(topic, b"x"))  # (the topic made; its queues known)
        queues = p.fetch_publish_message_queues(topic)
        for i in range((n - 1) // 500 + 1):
            p.send_batch([Message(topic, b"x" * 128, tags="TagA") for _ in range(500)], queue=queues[i % len(queues)])


def _receive(c: SimpleConsumer, n: int, ack: bool) -> int:
    got = 0
    while got < n:
        msgs = c.receive(32, 3600)
        if ack and msgs:
            c.ack(msgs)
        got += len(msgs)
    return got


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    c = NamesrvAndBroker(tmp_path_factory.mktemp("rmq-bench-pop-scale"), broker_props=PROPS)
    try:
        _fill(c.namesrv, TOPIC, max(INFLIGHT_SIZES) + DRAIN + 1)
        yield c
    finally:
        c.stop()


@pytest.mark.parametrize("inflight", INFLIGHT_SIZES)
def test_pop_with_messages_in_flight(benchmark, broker, inflight):
    benchmark.group = "pop-scaling-inflight"
    group = f"CG_POP_SCALE{next(_ids)}"
    c = SimpleConsumer(group, namesrv=broker.namesrv, subscriptions={TOPIC: "*"}, **SIMPLE).start()
    try:
        _receive(c, inflight, ack=False)  # held: invisible for an hour
        times = []

        def drain():
            t = time.perf_counter()
            _receive(c, DRAIN, ack=True)
            times.append(time.perf_counter() - t)

        # one round: the group's pop offset moves on, so a second would drain other messages
        benchmark.pedantic(drain, rounds=1, iterations=1)
        rate = DRAIN / times[0]
        _rates[inflight] = rate
        benchmark.extra_info["msgs_per_s"] = round(rate)
        benchmark.extra_info["inflight_in_broker"] = sum(s for s in INFLIGHT_SIZES if s <= inflight)
        if 0 in _rates:
            benchmark.extra_info["vs_no_inflight"] = round(rate / _rates[0], 2)
    finally:
        c.shutdown()


@pytest.mark.parametrize("unacked", UNACKED_SIZES)
def test_restart_with_unacked(benchmark, tmp_path, unacked):
    benchmark.group = "pop-scaling-restart"
    c = NamesrvAndBroker(tmp_path, broker_props={**PROPS, "flushConsumerOffsetInterval": 3_600_000})
    try:
        _fill(c.namesrv, TOPIC, max(UNACKED_SIZES) + 1)  # the same log to recover whatever N is
        consumer = SimpleConsumer("CG_POP_RESTART", namesrv=c.namesrv, subscriptions={TOPIC: "*"}, **SIMPLE).start()
        try:
            _receive(consumer, unacked, ack=False)
        finally:
            consumer.shutdown()
        c.brokers[0].kill()
        took = []

        def restart():
            t = time.perf_counter()
            c.restart_broker(0, timeout=600)
            took.append(time.perf_counter() - t)

        benchmark.pedantic(restart, rounds=1, iterations=1)
        _restarts[unacked] = took[0]
        benchmark.extra_info["restart_s"] = round(took[0], 3)
        if unacked and 0 in _restarts:
            benchmark.extra_info["replay_us_per_unacked"] = round((took[0] - _restarts[0]) / unacked * 1e6, 1)
    finally:
        c.stop()
