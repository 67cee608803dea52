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


WAITERS = (1, 8, 32)
TRICKLE = 300


@pytest.mark.parametrize("waiters", WAITERS)
def test_broker_cpu_per_message_with_consumers_long_polling(benchmark, tmp_path, waiters):
    """The broker's CPU per message delivered while `waiters` consumers of one group hold long
    polls on a one-queue topic and messages arrive one at a time: a message wakes the held pops
    of its queue, so a cost per waiter per message shows here as CPU growing with `waiters` (the
    broker's idle CPU rate with the pops held, measured first, is taken off).  extra_info: cpu_us_per_msg and vs_one_waiter (the ratio to the 1-waiter case of the run)."""
    import asyncio

    import psutil

    from rmq_core import aio

    benchmark.group = "pop-scaling-long-polling"
    c = NamesrvAndBroker(tmp_path, broker_props=PROPS)
    try:
        from rmq_core.admin import AdminClient

        with AdminClient(c.namesrv) as a:
            a.create_or_update_topic(c.broker_addrs[0], "PopTrickle", read_queue_nums=1, write_queue_nums=1)
        proc = psutil.Process(c.brokers[0].proc.pid)
        got = []

        async def run():
            consumers = [aio.SimpleConsumer("CG_POP_TRICKLE", c.namesrv, subscriptions={"PopTrickle": "*"},
                                            consume_from_where="CONSUME_FROM_FIRST_OFFSET", await_duration=20)
                         for _ in range(waiters)]
            for sc in consumers:
                await sc.start()

            async def consume(sc):
                while len(got) < TRICKLE:
                    msgs = await sc.receive(32, 60)
                    if msgs:
                        got.extend(msgs)
                        await sc.ack(msgs)

            tasks = [asyncio.create_task(consume(sc)) for sc in consumers]
            await asyncio.sleep(1.0)  # every consumer's first pop held
            async with aio.Producer("PG_POP_TRICKLE", c.namesrv) as p:
                # the broker's own CPU rate with the pops held and nothing arriving, taken off below
                idle_t, idle_cpu = time.perf_counter(), _cpu(proc)
                await asyncio.sleep(2.0)
                idle_rate = (_cpu(proc) - idle_cpu) / (time.perf_counter() - idle_t)
                t, cpu = time.perf_counter(), _cpu(proc)
                for i in range(TRICKLE):
                    await p.send(Message("PopTrickle", b"x" * 128))
                    await asyncio.sleep(0.002)  # one at a time: each arrival meets the held pops
                while len(got) < TRICKLE:
                    await asyncio.sleep(0.01)
                used = _cpu(proc) - cpu - idle_rate * (time.perf_counter() - t)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for sc in consumers:
                await sc.shutdown()
            return used / TRICKLE

        per_msg = []
        benchmark.pedantic(lambda: per_msg.append(asyncio.run(run())), rounds=1, iterations=1)
        _cpu_per_msg[waiters] = per_msg[0]
        benchmark.extra_info["cpu_us_per_msg"] = round(per_msg[0] * 1e6, 1)
        if 1 in _cpu_per_msg:
            benchmark.extra_info["vs_one_waiter"] = round(per_msg[0] / _cpu_per_msg[1], 2)
    finally:
        c.stop()


_cpu_per_msg: dict[int, float] = {}


def _cpu(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


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
