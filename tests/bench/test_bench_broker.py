"""Broker send throughput and sync-send round trip over TCP, against an `rmq standalone` process.

The load generator is a raw remoting client in this process (no rmq client library), so the
figures are the broker's path: decode, validate, append, respond.  Baselines in the same run:
* send-rtt: a bare-socket ping-pong of the same frame size to an echo server in another process
  (the floor for any request/response over loopback);
* send-throughput: the same pipelined frames to that echo server (the loopback + Python ceiling).
"""
import asyncio
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from tests.codec_oracle import encode_batch_items
from rmq_core.remoting import RemotingClient, RemotingCommand
from rmq_core.remoting.codes import RequestCode
from tests.servers import RmqProcess, free_port

BODY = b"x" * 128
N_PIPELINED = 4000
WINDOW = 128
BATCH = 64

ECHO = r"""
import socket, struct, sys, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(16); print(srv.getsockname()[1], flush=True)
def serve(c):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    while True:
        d = c.recv(1 << 20)
        if not d: return
        buf += d
        out = []
        while len(buf) >= 4:
            (n,) = struct.unpack(">i", buf[:4])
            if len(buf) < 4 + n: break
            out.append(buf[:4 + n]); buf = buf[4 + n:]
        if out: c.sendall(b"".join(out))
while True:
    c, _ = srv.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench-broker")
    b_port = free_port()
    p = RmqProcess(["standalone", "--store", str(tmp / "store"), "--namesrv-listen", f"127.0.0.1:{free_port()}",
                    "--broker-listen", f"127.0.0.1:{b_port}"], ("boot success. serializeType=JSON and",))
    p.wait_boot()
    yield f"127.0.0.1:{b_port}"
    p.terminate()


@pytest.fixture(scope="module")
def echo():
    proc = subprocess.Popen([sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    yield port
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _send_request(queue_id=0) -> RemotingCommand:
    return RemotingCommand.create_request(RequestCode.SEND_MESSAGE_V2, {
        "a": "PG_BENCH", "b": "BenchSend", "c": "TBW102", "d": "4", "e": str(queue_id), "f": "0",
        "g": str(int(time.time() * 1000)), "h": "0", "i": "UNIQ_KEY\x01BENCH\x02WAIT\x01true\x02", "j": "0",
        "k": "false", "m": "false"}, BODY)


def _batch_request() -> RemotingCommand:
    body = encode_batch_items([(0, BODY, {"UNIQ_KEY": f"B{i}", "WAIT": "true"}) for i in range(BATCH)])
    return RemotingCommand.create_request(RequestCode.SEND_BATCH_MESSAGE, {
        "producerGroup": "PG_BENCH", "topic": "BenchSend", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": "1", "sysFlag": "0", "bornTimestamp": str(int(time.time() * 1000)), "flag": "0",
        "properties": "", "reconsumeTimes": "0", "unitMode": "false", "batch": "true"}, body)


async def _pipelined(client, addr, make, n, window):
    sem = asyncio.Semaphore(window)

    async def one():
        async with sem:
            r = await client.invoke(addr, make(), 10)
            assert r.code == 0, r.remark

    await asyncio.gather(*(one() for _ in range(n)))


@pytest.mark.benchmark(group="broker-send-rtt")
def test_send_rtt_baseline_bare_socket_pingpong(benchmark, echo):
    frame = _send_request().encode()
    s = socket.create_connection(("127.0.0.1", echo))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def pingpong():
        s.sendall(frame)
        got = 0
        while got < len(frame):
            got += len(s.recv(65536))

    benchmark.pedantic(pingpong, rounds=2000, warmup_rounds=100)
    s.close()


@pytest.mark.benchmark(group="broker-send-rtt")
def test_send_rtt_broker_sync_send(benchmark, broker, loop):
    client = RemotingClient(name="bench")
    loop.run_until_complete(client.invoke(broker, _send_request(), 10))  # connect + create the topic

    def send():
        r = loop.run_until_complete(client.invoke(broker, _send_request(), 10))
        assert r.code == 0

    benchmark.pedantic(send, rounds=2000, warmup_rounds=100)
    stats = benchmark.stats.stats
    benchmark.extra_info["p50_us"] = round(stats.median * 1e6, 1)
    loop.run_until_complete(client.close())


@pytest.mark.benchmark(group="broker-send-throughput")
def test_send_throughput_baseline_echo(benchmark, echo, loop):
    """The same pipelined frames to a bare echo server: what loopback + this load generator allow."""
    frame = _send_request().encode()

    async def run():
        reader, writer = await asyncio.open_connection("127.0.0.1", echo)
        sent = 0
        for _ in range(N_PIPELINED // WINDOW):
            writer.write(frame * WINDOW)
            await writer.drain()
            await reader.readexactly(len(frame) * WINDOW)
            sent += WINDOW
        writer.close()
        return sent

    n = benchmark.pedantic(lambda: loop.run_until_complete(run()), rounds=5, warmup_rounds=1)
    benchmark.extra_info["msgs_per_s"] = round(n / benchmark.stats.stats.median)


@pytest.mark.benchmark(group="broker-send-throughput")
def test_send_throughput_one_at_a_time_pipelined(benchmark, broker, loop):
    client = RemotingClient(name="bench")
    run = lambda: loop.run_until_complete(_pipelined(client, broker, _send_request, N_PIPELINED, WINDOW))  # noqa: E731
    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    benchmark.extra_info["msgs_per_s"] = round(N_PIPELINED / benchmark.stats.stats.median)
    benchmark.extra_info["MB_per_s"] = round(N_PIPELINED * len(BODY) / benchmark.stats.stats.median / 1e6, 1)
    loop.run_until_complete(client.close())


@pytest.mark.benchmark(group="broker-send-throughput")
def test_send_throughput_batched(benchmark, broker, loop):
    client = RemotingClient(name="bench")
    n_batches = N_PIPELINED // BATCH * 4
    run = lambda: loop.run_until_complete(_pipelined(client, broker, _batch_request, n_batches, 8))  # noqa: E731
    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    msgs = n_batches * BATCH
    benchmark.extra_info["msgs_per_s"] = round(msgs / benchmark.stats.stats.median)
    benchmark.extra_info["MB_per_s"] = round(msgs * len(BODY) / benchmark.stats.stats.median / 1e6, 1)
    loop.run_until_complete(client.close())


def test_bench_file_is_importable():
    assert os.path.basename(__file__).startswith("test_bench_")
