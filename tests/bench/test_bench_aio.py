"""The asyncio API and interception, beside the plain producer in the same run.

Groups (broker: `rmq namesrv` + `rmq broker` subprocesses on loopback, as in test_bench_client):
* client-aio-{128B,1KiB}: 1000 messages as rounds of 50 in flight - baseline Producer.send_async
  (Futures awaited with result()) vs rmq_core.aio.Producer.send (50 coroutines gathered on a
  running event loop, asyncio's and uvloop's).
* client-rpc-hook-{sync,async}: 1000 sends - baseline without an RPC hook vs the same producer
  settings on a client started while one no-op rmq_rpc_before_request / rmq_rpc_after_response
  plugin is registered: what one registered hook costs in sends/s.
"""
import asyncio
import itertools

import pytest

from rmq_core import Message, Producer, aio
from rmq_core.plugins import get_plugin_manager, hookimpl
from tests.servers import NamesrvAndBroker

SIZES = {"128B": 128, "1KiB": 1024}
N = 1000
IN_FLIGHT = 50
ROUNDS = 7
FAST = dict(poll_name_server_interval=5.0, heartbeat_broker_interval=5.0, persist_consumer_offset_interval=1.0)
_ids = itertools.count()


@pytest.fixture(scope="module")
def rmq_cluster(tmp_path_factory):
    c = NamesrvAndBroker(tmp_path_factory.mktemp("rmq-bench-aio"), broker_props={"flushDiskType": "ASYNC_FLUSH"})
    yield c
    c.stop()


@pytest.fixture(scope="module")
def producer(rmq_cluster):
    p = Producer("PG_BENCH_AIO_BASE", namesrv=rmq_cluster.namesrv, instance_name="bench-aio-base", **FAST).start()
    for size in SIZES.values():
        p.send(Message(f"BenchAio{size}", b"x" * size))
    yield p
    p.shutdown()


def _rate(benchmark):
    benchmark.extra_info["msgs_per_s"] = N / benchmark.stats.stats.median


@pytest.mark.parametrize("size", list(SIZES))
def test_aio_baseline_send_async(benchmark, producer, size):
    benchmark.group = f"client-aio-{size}"
    body, topic = b"x" * SIZES[size], f"BenchAio{SIZES[size]}"

    def run():
        for _ in range(N // IN_FLIGHT):
            for f in [producer.send_async(Message(topic, body, tags="TagA")) for _ in range(IN_FLIGHT)]:
                f.result(30)

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    _rate(benchmark)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
@pytest.mark.parametrize("size", list(SIZES))
def test_aio_producer_send(benchmark, rmq_cluster, size, loop_kind):
    benchmark.group = f"client-aio-{size}"
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    body, topic = b"x" * SIZES[size], f"BenchAio{SIZES[size]}"
    p = aio.Producer(f"PG_BENCH_AIO_{next(_ids)}", namesrv=rmq_cluster.namesrv,
                     instance_name=f"bench-aio-{next(_ids)}", **FAST)

    async def rounds():
        for _ in range(N // IN_FLIGHT):
            await asyncio.gather(*(p.send(Message(topic, body, tags="TagA")) for _ in range(IN_FLIGHT)))

    try:
        loop.run_until_complete(p.start())
        loop.run_until_complete(p.send(Message(topic, body)))
        benchmark.pedantic(lambda: loop.run_until_complete(rounds()), rounds=ROUNDS, iterations=1, warmup_rounds=1)
    finally:
        loop.run_until_complete(p.shutdown())
        loop.close()
    _rate(benchmark)


class _NoOpRpcHook:
    @hookimpl
    def rmq_rpc_before_request(self, remote_addr, request):
        pass

    @hookimpl
    def rmq_rpc_after_response(self, remote_addr, request, response):
        pass


def _sends(benchmark, p, mode):
    topic = "BenchAio128"
    body = b"x" * 128

    def run():
        if mode == "sync":
            for _ in range(N):
                p.send(Message(topic, body))
        else:
            for _ in range(N // IN_FLIGHT):
                for f in [p.send_async(Message(topic, body)) for _ in range(IN_FLIGHT)]:
                    f.result(30)

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    _rate(benchmark)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_rpc_hook_baseline_none(benchmark, producer, mode):
    benchmark.group = f"client-rpc-hook-{mode}"
    _sends(benchmark, producer, mode)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_rpc_hook_one_noop(benchmark, rmq_cluster, mode):
    benchmark.group = f"client-rpc-hook-{mode}"
    pm = get_plugin_manager()
    hook = _NoOpRpcHook()
    pm.register(hook, name="bench-noop-rpc-hook")
    try:  # (hooks are looked up when the client starts)
        p = Producer(f"PG_BENCH_HOOK_{next(_ids)}", namesrv=rmq_cluster.namesrv,
                     instance_name=f"bench-hook-{next(_ids)}", **FAST).start()
        try:
            p.send(Message("BenchAio128", b"warm"))
            _sends(benchmark, p, mode)
        finally:
            p.shutdown()
    finally:
        pm.unregister(hook)
