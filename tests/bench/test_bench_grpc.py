"""The broker's CPU per message on the gRPC send path (RocketMQ 5's SendMessage, rmq_core/proxy)
against the remoting send path (SEND_MESSAGE_V2) for the same sends, in one run.

One `rmq standalone` process serves both; the load generators (a raw remoting client, a raw
grpc.aio stub, both in this process, each keeping WINDOW sends in flight) send the same messages:
128-byte body, a tag, a key, a message id.  The figure is the broker process's CPU time (user +
system, psutil) per message over the timed rounds: `cpu_us_per_msg`; the gRPC entry also carries
`cpu_vs_remoting` (goal <= 1.5)."""
from __future__ import annotations

import asyncio
import time
import uuid

import psutil
import pytest

from rmq_core.remoting import RemotingClient, RemotingCommand
from rmq_core.remoting.codes import RequestCode
from tests.servers import RmqProcess, free_port

BODY = b"x" * 128
N = 4000
WINDOW = 128
TOPIC = "BenchGrpc"
_cpu: dict[str, float] = {}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench-grpc")
    b_port, g_port, ns_port = free_port(), free_port(), free_port()
    p = RmqProcess(["standalone", "--store", str(tmp / "store"), "--namesrv-listen", f"127.0.0.1:{ns_port}",
                    "--broker-listen", f"127.0.0.1:{b_port}", "--grpc-listen", f"127.0.0.1:{g_port}"],
                   ("boot success. serializeType=JSON and", "serves RocketMQ 5 clients"))
    p.wait_boot()
    from rmq_core.admin import AdminClient

    with AdminClient(f"127.0.0.1:{ns_port}") as a:
        a.create_or_update_topic(f"127.0.0.1:{b_port}", TOPIC, read_queue_nums=4, write_queue_nums=4)
    yield psutil.Process(p.proc.pid), f"127.0.0.1:{b_port}", f"127.0.0.1:{g_port}"
    p.terminate()


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _measure(benchmark, proc, name: str, run) -> None:
    """Time `run` (N sends) over rounds; the broker's CPU per message over the timed rounds."""
    rounds = 5
    run()  # warm-up (connections, the topic's checks, the broker's caches)
    before = _cpu_seconds(proc)
    benchmark.pedantic(run, rounds=rounds, warmup_rounds=0)
    per_msg = (_cpu_seconds(proc) - before) / (rounds * N)
    _cpu[name] = per_msg
    benchmark.extra_info["cpu_us_per_msg"] = round(per_msg * 1e6, 1)
    benchmark.extra_info["msgs_per_s"] = round(N / benchmark.stats.stats.median)


def _remoting_request() -> RemotingCommand:
    props = f"TAGS\x01TagA\x02KEYS\x01key-1\x02UNIQ_KEY\x01{uuid.uuid4().hex.upper()}\x02WAIT\x01true\x02"
    return RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, {
        "a": "PG_BENCH", "b": TOPIC, "c": "TBW102", "d": "4", "e": "-1", "f": "0",
        "g": str(int(time.time() * 1000)), "h": "0", "i": props, "j": "0", "k": "false", "m": "false"}, BODY)


@pytest.mark.benchmark(group="broker-cpu-per-send")
def test_broker_cpu_per_send_baseline_remoting(benchmark, broker, loop):
    proc, addr, _ = broker
    client = RemotingClient(name="bench-grpc")

    async def sends():
        sem = asyncio.Semaphore(WINDOW)

        async def one():
            async with sem:
                r = await client.invoke(addr, _remoting_request(), 10)
                assert r.code == 0, r.remark

        await asyncio.gather(*(one() for _ in range(N)))

    _measure(benchmark, proc, "remoting", lambda: loop.run_until_complete(sends()))
    loop.run_until_complete(client.close())


@pytest.mark.benchmark(group="broker-cpu-per-send")
def test_broker_cpu_per_rpc_grpc_floor_heartbeat(benchmark, broker, loop):
    """The gRPC server's own cost of an RPC on the broker (HTTP/2, HPACK, dispatch): a Heartbeat (the
    handler does next to nothing)."""
    import grpc

    from rmq_core.proxy.proto.apache.rocketmq.v2 import definition_pb2 as pb
    from rmq_core.proxy.proto.apache.rocketmq.v2 import service_pb2 as spb
    from rmq_core.proxy.proto.apache.rocketmq.v2 import service_pb2_grpc as spb_grpc

    proc, _, endpoint = broker
    md = (("x-mq-client-id", "bench-grpc-floor"),)

    async def calls(channel):
        stub = spb_grpc.MessagingServiceStub(channel)
        sem = asyncio.Semaphore(WINDOW)

        async def one():
            async with sem:
                r = await stub.Heartbeat(spb.HeartbeatRequest(), metadata=md, timeout=10)
                assert r.status.code == pb.OK, r.status

        await asyncio.gather(*(one() for _ in range(N)))

    async def open_channel():
        return grpc.aio.insecure_channel(endpoint)

    channel = loop.run_until_complete(open_channel())
    _measure(benchmark, proc, "grpc_floor", lambda: loop.run_until_complete(calls(channel)))
    loop.run_until_complete(channel.close())


@pytest.mark.benchmark(group="broker-cpu-per-send")
def test_broker_cpu_per_send_grpc(benchmark, broker, loop):
    import grpc

    from rmq_core.proxy.proto.apache.rocketmq.v2 import definition_pb2 as pb
    from rmq_core.proxy.proto.apache.rocketmq.v2 import service_pb2 as spb
    from rmq_core.proxy.proto.apache.rocketmq.v2 import service_pb2_grpc as spb_grpc

    proc, _, endpoint = broker
    md = (("x-mq-client-id", "bench-grpc"), ("x-mq-language", "PYTHON"), ("x-mq-client-version", "5.1.2"))

    async def sends(channel):
        stub = spb_grpc.MessagingServiceStub(channel)
        sem = asyncio.Semaphore(WINDOW)

        async def one():
            m = pb.Message(topic=pb.Resource(name=TOPIC), body=BODY, system_properties=pb.SystemProperties(
                tag="TagA", keys=["key-1"], message_id=uuid.uuid4().hex.upper(), message_type=pb.NORMAL,
                body_encoding=pb.IDENTITY, queue_id=-1))
            async with sem:
                r = await stub.SendMessage(spb.SendMessageRequest(messages=[m]), metadata=md, timeout=10)
                assert r.status.code == pb.OK, r.status

        await asyncio.gather(*(one() for _ in range(N)))

    async def open_channel():
        return grpc.aio.insecure_channel(endpoint)

    channel = loop.run_until_complete(open_channel())
    _measure(benchmark, proc, "grpc", lambda: loop.run_until_complete(sends(channel)))
    if "grpc_floor" in _cpu:
        benchmark.extra_info["of_it_rpc_floor_us"] = round(_cpu["grpc_floor"] * 1e6, 1)
    loop.run_until_complete(channel.close())
    if "remoting" in _cpu:
        benchmark.extra_info["cpu_vs_remoting"] = round(_cpu["grpc"] / _cpu["remoting"], 2)
        print(f"\nbroker CPU per message: remoting {_cpu['remoting'] * 1e6:.1f} us, gRPC {_cpu['grpc'] * 1e6:.1f} us "
              f"({_cpu['grpc'] / _cpu['remoting']:.2f}x; goal <= 1.5x)")
