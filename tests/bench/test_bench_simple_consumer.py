"""Receive + ack throughput of rmq's SimpleConsumer (pop consumption over the remoting protocol)
against its PushConsumer with RocketMQ's defaults, draining the same backlog (N_BACKLOG stored 128 B
messages) with a new consumer group each round; the broker runs as `rmq namesrv` + `rmq broker`
subprocesses on loopback.

Group client-simple-consume (baseline: the PushConsumer, defaults: listener batch 1, 20 consume
threads, pull batch 32):
* sync: receive(32, 30 s), then ack() each message in turn (one round trip each);
* ack_async: receive(32, 30 s), the batch's acks in flight at once (ack_async each, then wait);
* batch_ack: receive(32, 30 s), then ack(msgs): one BATCH_ACK_MESSAGE for the batch;
* aio: rmq_core.aio.SimpleConsumer, `await receive(32, 30)` then `await ack(msgs)`;
* aio_16: sixteen asyncio tasks sharing one aio.SimpleConsumer, each as `aio` (an asyncio app
  consuming concurrently);
* batch_ack_1024: receive(1024, 30), then ack(msgs): rmq's broker hands out up to 1024 per pop (as
  rmq's own clients pull up to 1024), and a receive of 32 is mostly its round trip;
* pipelined_1024: receive(1024, 30), its ack(msgs) sent with ack_async and waited for only after the
  next receive (one batch's ack in flight while the next is received);
* threads_4 / threads_16: four (sixteen) threads sharing one SimpleConsumer, each receive(32, 30)
  then ack(msgs) (how a RocketMQ 5 SimpleConsumer scales at 32 per receive, RocketMQ's cap for a
  pop; the receives that overlap a pop in flight go as one pop when it ends).
The first five and the last two are the RocketMQ 5 clients' way (32 per receive); batch_ack_1024 and
pipelined_1024 what rmq's own SimpleConsumer offers a user after throughput.
test_simple_consume_interleaved drains with each of them round after round (a load drifting on this
shared machine hits every one) and puts the rates and ratios to the push consumer in extra_info
(the issue's goal: simple vs push >= 0.7)."""
import asyncio
import itertools
import threading
import time

import pytest

from rmq_core import Message, Producer, SimpleConsumer, aio
from tests.bench.test_bench_client import FAST, _push_consumer, _push_drain
from tests.servers import NamesrvAndBroker

N_BACKLOG = 20000
TOPIC = "SimpleBench"
ROUNDS = 3
INTERLEAVED_ROUNDS = 3
_ids = itertools.count()
SIMPLE = dict(consume_from_where="CONSUME_FROM_FIRST_OFFSET", await_duration=1.0, **FAST)


@pytest.fixture(scope="module")
def backlog(tmp_path_factory):
    """(name server, number of queues) of a broker whose TOPIC holds N_BACKLOG messages."""
    c = NamesrvAndBroker(tmp_path_factory.mktemp("rmq-bench-simple"), broker_props={"flushDiskType": "ASYNC_FLUSH"})
    try:
        with Producer("PG_BENCH_SIMPLE", namesrv=c.namesrv, **FAST) as p:
            p.send(Message(TOPIC, b"x"))  # (the topic made; its queues known)
            queues = p.fetch_publish_message_queues(TOPIC)
            for i in range((N_BACKLOG - 1) // 500 + 1):
                p.send_batch([Message(TOPIC, b"x" * 128, tags="TagA") for _ in range(500)], queue=queues[i % len(queues)])
        yield c.namesrv, len(queues)
    finally:
        c.stop()


def _simple_drain(namesrv, mode: str, batch: int | None = None, count: int | None = None) -> float:
    """Seconds a new group's SimpleConsumer takes to receive and ack `count` (N_BACKLOG) messages,
    `batch` (32, or 1024 for the *_1024 modes) per receive."""
    group = f"CG_BENCH_SIMPLE{next(_ids)}"
    count = count or N_BACKLOG
    batch = batch or (1024 if mode.endswith("_1024") else 32)
    if mode.startswith("aio"):
        return asyncio.run(_aio_drain(namesrv, group, int(mode.removeprefix("aio").lstrip("_") or 1), batch, count))
    if mode.startswith("threads_"):
        return _threads_drain(namesrv, group, int(mode.removeprefix("threads_")))
    c = SimpleConsumer(group, namesrv=namesrv, subscriptions={TOPIC: "*"}, **SIMPLE).start()
    try:
        n = 0
        in_flight = None
        t = time.perf_counter()
        while n < count:
            msgs = c.receive(batch, 30)
            if mode == "sync":
                for m in msgs:
                    c.ack(m)
            elif mode.startswith("batch_ack"):
                c.ack(msgs)
            elif mode == "pipelined_1024":
                if in_flight is not None:
                    in_flight.result(30)
                in_flight = c.ack_async(msgs)
            else:
                for f in [c.ack_async(m) for m in msgs]:
                    f.result(30)
            n += len(msgs)
        if in_flight is not None:
            in_flight.result(30)
        return time.perf_counter() - t
    finally:
        c.shutdown()


def _threads_drain(namesrv, group, threads: int) -> float:
    """Seconds until `threads` threads sharing a SimpleConsumer have received and acked N_BACKLOG."""
    c = SimpleConsumer(group, namesrv=namesrv, subscriptions={TOPIC: "*"}, **SIMPLE).start()
    lock, count, done = threading.Lock(), [0], threading.Event()

    def work():
        while not done.is_set():
            msgs = c.receive(32, 30)
            if msgs:
                c.ack(msgs)
            with lock:
                count[0] += len(msgs)
                if count[0] >= N_BACKLOG:
                    done.set()  # (the time stops here: a receive still polling at the end is not in it)

    try:
        workers = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
        t = time.perf_counter()
        for w in workers:
            w.start()
        assert done.wait(120), f"{count[0]} of {N_BACKLOG} received"
        elapsed = time.perf_counter() - t
        for w in workers:
            w.join(30)
        return elapsed
    finally:
        c.shutdown()


async def _aio_drain(namesrv, group, tasks: int, batch: int = 32, count: int = N_BACKLOG) -> float:
    """Seconds until `tasks` asyncio tasks sharing an aio.SimpleConsumer, `batch` per receive,
    have received and acked `count`."""
    async with aio.SimpleConsumer(group, namesrv, subscriptions={TOPIC: "*"}, **SIMPLE) as c:
        got, done = [0], asyncio.Event()

        async def work():
            while not done.is_set():
                msgs = await c.receive(batch, 30)
                if msgs:
                    await c.ack(msgs)
                got[0] += len(msgs)
                if got[0] >= count:
                    done.set()  # (the time stops here, as _threads_drain's)

        t = time.perf_counter()
        workers = [asyncio.ensure_future(work()) for _ in range(tasks)]
        await asyncio.wait_for(done.wait(), 120)
        elapsed = time.perf_counter() - t
        await asyncio.wait_for(asyncio.gather(*workers), 60)
        return elapsed


def _rate(benchmark):
    benchmark.extra_info["msgs_per_s"] = N_BACKLOG / benchmark.stats.stats.median


def test_simple_consume_baseline_push_consumer_defaults(benchmark, backlog):
    benchmark.group = "client-simple-consume"
    namesrv, n_queues = backlog

    def setup():
        return _push_consumer(namesrv, TOPIC, n_queues, {}, N_BACKLOG), {}

    def run(c, done):
        c.resume()
        assert done.wait(120), "push consumer did not drain the topic"

    benchmark.pedantic(run, setup=setup, teardown=lambda c, done: c.shutdown(), rounds=ROUNDS, iterations=1)
    _rate(benchmark)


MODES = ("sync", "ack_async", "batch_ack", "aio", "aio_16", "batch_ack_1024", "pipelined_1024", "threads_4", "threads_16")


@pytest.mark.parametrize("mode", MODES)
def test_simple_consume_simple_consumer(benchmark, backlog, mode):
    benchmark.group = "client-simple-consume"
    namesrv, _ = backlog
    times = []

    def run():
        times.append(_simple_drain(namesrv, mode))

    # (the round's time is the drain's own: the consumer's start and shutdown are not in it)
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    benchmark.extra_info["msgs_per_s"] = N_BACKLOG / sorted(times)[len(times) // 2]


def test_simple_consume_interleaved(benchmark, backlog):
    """Every round drains the backlog with the push consumer (defaults) and each SimpleConsumer
    way in turn; extra_info: rates and the ratios simple / push."""
    benchmark.group = "client-simple-consume-interleaved"
    namesrv, n_queues = backlog
    times = {name: [] for name in ("push_defaults", *(f"simple_{mode}" for mode in MODES))}

    def round_():
        times["push_defaults"].append(_push_drain(namesrv, TOPIC, n_queues, {}, N_BACKLOG))
        for mode in MODES:
            times[f"simple_{mode}"].append(_simple_drain(namesrv, mode))

    benchmark.pedantic(round_, rounds=INTERLEAVED_ROUNDS, iterations=1)
    rate = {name: N_BACKLOG / sorted(ts)[len(ts) // 2] for name, ts in times.items()}
    benchmark.extra_info.update({f"{name}_msgs_per_s": r for name, r in rate.items()})
    benchmark.extra_info.update({f"{name}_vs_push": rate[name] / rate["push_defaults"]
                                 for name in rate if name != "push_defaults"})


SCALE_BATCHES = (1, 8, 32, 128, 1024)
SCALE_TASKS = (1, 4, 16, 64)


def test_simple_consume_grows_with_receive_size_and_tasks(benchmark, backlog):
    """How receive+ack grows with the work per request and with concurrency, round after round:
    one caller receiving `batch` (1 .. 1024) and acking them with one BATCH_ACK_MESSAGE; and 1 .. 64
    asyncio tasks sharing one aio.SimpleConsumer at 32 per receive.  extra_info: each rate, the
    caller's microseconds per receive+ack cycle (nearly flat while a cycle is two round trips,
    so the rate grows with the batch), and the growth ratios."""
    benchmark.group = "client-simple-consume-scaling"
    namesrv, _ = backlog
    # (a receive of 1 is a round trip per message: fewer of them keep its drain short)
    counts = {b: min(N_BACKLOG, 500 * b) for b in SCALE_BATCHES}
    times = {**{f"batch{b}": [] for b in SCALE_BATCHES}, **{f"tasks{t}": [] for t in SCALE_TASKS}}

    def round_():
        for b in SCALE_BATCHES:
            times[f"batch{b}"].append(_simple_drain(namesrv, "batch_ack", batch=b, count=counts[b]))
        for t in SCALE_TASKS:
            times[f"tasks{t}"].append(_simple_drain(namesrv, f"aio_{t}"))

    benchmark.pedantic(round_, rounds=2, iterations=1)
    median = {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}
    rate = {f"batch{b}": counts[b] / median[f"batch{b}"] for b in SCALE_BATCHES}
    rate.update({f"tasks{t}": N_BACKLOG / median[f"tasks{t}"] for t in SCALE_TASKS})
    benchmark.extra_info.update({f"{name}_msgs_per_s": r for name, r in rate.items()})
    benchmark.extra_info.update({f"batch{b}_us_per_cycle": 1e6 * b / rate[f"batch{b}"] for b in SCALE_BATCHES})
    benchmark.extra_info.update(batch1024_vs_batch1=rate["batch1024"] / rate["batch1"],
                                batch32_vs_batch1=rate["batch32"] / rate["batch1"],
                                tasks16_vs_tasks1=rate["tasks16"] / rate["tasks1"],
                                tasks64_vs_tasks16=rate["tasks64"] / rate["tasks16"])
